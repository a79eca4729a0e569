package warren

import (
	"math/bits"
	"slices"
	"strings"
)

// topicTrie maps topic binding patterns to destinations and finds the destinations whose
// pattern matches a routing key. Patterns are stored word by word in a trie, so a match
// walks only the part of the trie that the key can reach, instead of testing every binding.
//
// Words are the `.`-separated parts of a pattern or key. Empty words are real words ("a..b" is
// [a, "", b] and "." is ["", ""]), but the empty string is zero words. In a pattern, the whole
// word `*` matches exactly one word (possibly the empty word) and the whole word `#` matches zero
// or more words; any other word, including `a*` or `#b`, matches only itself.
//
// A topicTrie is not safe for concurrent use: the caller holds a lock. match does not modify
// the trie, so concurrent matches under a read lock are safe. The zero value is not usable;
// use [newTopicTrie].
type topicTrie[D comparable] struct {
	root topicNode[D]
	n    int // number of (pattern, destination) bindings
}

// topicNode is the trie node reached by a pattern prefix. The edges are split by word kind so
// that a match tries `*` and `#` without a map lookup.
//
// Invariant: every node other than the root has a destination or a child; remove prunes nodes
// that lose both.
type topicNode[D comparable] struct {
	lit   map[string]*topicNode[D] // literal words; nil when there are none
	star  *topicNode[D]            // the word `*`
	hash  *topicNode[D]            // the word `#`
	dests []D                      // destinations bound with exactly this pattern, no duplicates
}

// newTopicTrie returns an empty trie.
func newTopicTrie[D comparable]() *topicTrie[D] {
	return &topicTrie[D]{}
}

// len returns the number of (pattern, destination) bindings. It is O(1).
func (t *topicTrie[D]) len() int { return t.n }

// add binds d with pattern and reports whether it did: it returns false if (pattern, d) was
// already bound. Patterns are not normalised: "#.#" and "#" match the same keys but are
// distinct bindings. It is O(w + b) for a pattern of w words whose node already holds b
// destinations.
func (t *topicTrie[D]) add(pattern string, d D) bool {
	n := &t.root
	for _, w := range splitWords(pattern) {
		n = n.child(w)
	}
	if slices.Contains(n.dests, d) {
		return false
	}
	n.dests = append(n.dests, d)
	t.n++
	return true
}

// remove unbinds d from pattern and reports whether it did: it returns false if (pattern, d)
// was not bound. Nodes left without destinations or children are pruned. It is O(w + b) for a
// pattern of w words whose node holds b destinations.
func (t *topicTrie[D]) remove(pattern string, d D) bool {
	if !t.root.remove(splitWords(pattern), d) {
		return false
	}
	t.n--
	return true
}

// match calls visit for each destination of each pattern that matches key. A destination
// bound with several matching patterns is visited once per such pattern, so the caller
// deduplicates; a single (pattern, destination) binding is visited at most once, however many
// ways its `#` words can match. visit must not modify the trie.
//
// The walk keeps, for each trie node it reaches, the set of key positions (byte offsets where
// a word starts, plus "end of key") at which the node's pattern prefix can have consumed the
// key so far. A child's set follows from its parent's alone, so each node is visited once and
// several `#` words cannot make the walk exponential. Complexity: O(V·k) for V reached nodes
// and a key of k bytes when no `#` precedes a reached node; below a `#`, a node whose set holds
// u distinct words costs O(u·k), so the worst case is O(V·k²). The trie's size beyond the
// reached nodes does not matter. It does not allocate for keys shorter than 319 bytes (AMQP
// routing keys are at most 255).
func (t *topicTrie[D]) match(key string, visit func(D)) {
	m := topicMatcher[D]{key: key, end: len(key) + 1, visit: visit}
	nw := posWords(len(key))
	var startsBuf, rootBuf [posInline]uint64
	var root []uint64
	if nw <= posInline {
		m.starts, root = startsBuf[:nw], rootBuf[:nw]
	} else {
		m.starts, root = make([]uint64, nw), make([]uint64, nw)
	}
	setPos(m.starts, m.end)
	if key == "" {
		setPos(root, m.end) // zero words: the root has consumed the whole key
	} else {
		setPos(root, 0)
		setPos(m.starts, 0)
		for i := range len(key) {
			if key[i] == '.' {
				setPos(m.starts, i+1)
			}
		}
	}
	m.walk(&t.root, root)
}

// child returns n's child along the pattern word w, creating it if needed.
func (n *topicNode[D]) child(w string) *topicNode[D] {
	switch w {
	case "*":
		if n.star == nil {
			n.star = &topicNode[D]{}
		}
		return n.star
	case "#":
		if n.hash == nil {
			n.hash = &topicNode[D]{}
		}
		return n.hash
	}
	c := n.lit[w]
	if c == nil {
		if n.lit == nil {
			n.lit = make(map[string]*topicNode[D])
		}
		c = &topicNode[D]{}
		n.lit[w] = c
	}
	return c
}

// remove removes d from the node reached from n by the pattern words, pruning emptied nodes
// on the way back up. It reports whether d was there.
func (n *topicNode[D]) remove(words []string, d D) bool {
	if len(words) == 0 {
		i := slices.Index(n.dests, d)
		if i < 0 {
			return false
		}
		n.dests = slices.Delete(n.dests, i, i+1) // keeps binding order; Delete zeroes the tail
		if len(n.dests) == 0 {
			n.dests = nil
		}
		return true
	}
	w := words[0]
	var c *topicNode[D]
	switch w {
	case "*":
		c = n.star
	case "#":
		c = n.hash
	default:
		c = n.lit[w]
	}
	if c == nil || !c.remove(words[1:], d) {
		return false
	}
	if c.empty() {
		switch w {
		case "*":
			n.star = nil
		case "#":
			n.hash = nil
		default:
			delete(n.lit, w)
			if len(n.lit) == 0 {
				n.lit = nil
			}
		}
	}
	return true
}

// empty reports whether n has neither destinations nor children.
func (n *topicNode[D]) empty() bool {
	return len(n.dests) == 0 && n.star == nil && n.hash == nil && len(n.lit) == 0
}

// splitWords returns the words of a pattern or key: nil for "", and otherwise the parts
// between dots, empty ones included. Only add and remove use it; match walks the key in place.
func splitWords(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ".")
}

// posInline is the number of 64-bit words of a position set kept on the stack: 5 words hold the
// positions 0 to 319, enough for keys of up to 318 bytes.
const posInline = 5

// topicMatcher is the state of one [topicTrie.match] call.
type topicMatcher[D comparable] struct {
	key    string
	end    int      // the position "whole key consumed": len(key)+1
	starts []uint64 // the positions at which a word starts, and end: where a `#` may stop
	visit  func(D)
}

// walk visits n, reached at the positions in set (non-empty), and its children. set is only
// read.
func (m *topicMatcher[D]) walk(n *topicNode[D], set []uint64) {
	if hasPos(set, m.end) {
		for _, d := range n.dests {
			m.visit(d)
		}
	}
	if n.star == nil && n.hash == nil && n.lit == nil {
		return
	}
	var childBuf, restBuf [posInline]uint64
	var child, rest []uint64
	if len(set) <= posInline {
		child, rest = childBuf[:len(set)], restBuf[:len(set)]
	} else {
		child, rest = make([]uint64, len(set)), make([]uint64, len(set))
	}
	if n.hash != nil {
		// `#` consumes zero or more words from the earliest position n was reached at, so
		// its set is every word start from there on, and the end. That set is closed upwards,
		// which is why a second `#` cannot multiply the work.
		lo, _ := nextPos(set, 0)
		copy(child, m.starts)
		clearBelow(child, lo)
		m.walk(n.hash, child)
	}
	if n.star != nil {
		clear(child)
		reached := false
		for p, ok := nextPos(set, 0); ok && p != m.end; p, ok = nextPos(set, p+1) {
			_, next := m.wordAt(p)
			setPos(child, next)
			reached = true
		}
		if reached {
			m.walk(n.star, child)
		}
	}
	if n.lit != nil {
		// Group the positions by word, so that a child reached at several positions (only
		// possible below a `#`) is walked once, with all of them.
		copy(rest, set)
		clearPos(rest, m.end)
		for p, ok := nextPos(rest, 0); ok; p, ok = nextPos(rest, p+1) {
			w, next := m.wordAt(p)
			c := n.lit[w]
			if c == nil {
				continue
			}
			clear(child)
			setPos(child, next)
			for q, ok := nextPos(rest, p+1); ok; q, ok = nextPos(rest, q+1) {
				if wq, nq := m.wordAt(q); wq == w {
					setPos(child, nq)
					clearPos(rest, q)
				}
			}
			m.walk(c, child)
		}
	}
}

// wordAt returns the word of the key that starts at position p (p < end) and the position
// after it.
func (m *topicMatcher[D]) wordAt(p int) (w string, next int) {
	i := strings.IndexByte(m.key[p:], '.')
	if i < 0 {
		return m.key[p:], m.end
	}
	return m.key[p : p+i], p + i + 1
}

// Position sets are bitsets over the positions 0 to len(key)+1 of one key.

// posWords returns the number of 64-bit words in a position set for a key of k bytes.
func posWords(k int) int { return (k + 2 + 63) / 64 }

func setPos(s []uint64, p int)      { s[p/64] |= 1 << (p % 64) }
func clearPos(s []uint64, p int)    { s[p/64] &^= 1 << (p % 64) }
func hasPos(s []uint64, p int) bool { return s[p/64]&(1<<(p%64)) != 0 }

// clearBelow removes the positions below p from s.
func clearBelow(s []uint64, p int) {
	clear(s[:p/64])
	s[p/64] &^= 1<<(p%64) - 1
}

// nextPos returns the smallest position in s that is at least p, or false if there is none.
func nextPos(s []uint64, p int) (int, bool) {
	i := p / 64
	if i >= len(s) {
		return 0, false
	}
	w := s[i] &^ (1<<(p%64) - 1)
	for {
		if w != 0 {
			return i*64 + bits.TrailingZeros64(w), true
		}
		i++
		if i == len(s) {
			return 0, false
		}
		w = s[i]
	}
}
