package warren

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// refTopicMatch is a deliberately naive reference for topic matching (R6.4): it splits both
// strings and recurses over the word slices. It is exponential in the number of `#` words, so
// callers keep their inputs small.
func refTopicMatch(pattern, key string) bool {
	return refTopicMatchWords(splitRef(pattern), splitRef(key))
}

func splitRef(s string) []string {
	if s == "" {
		return nil // the empty string is zero words
	}
	return strings.Split(s, ".")
}

func refTopicMatchWords(pat, key []string) bool {
	if len(pat) == 0 {
		return len(key) == 0
	}
	switch pat[0] {
	case "#":
		return refTopicMatchWords(pat[1:], key) || len(key) > 0 && refTopicMatchWords(pat, key[1:])
	case "*":
		return len(key) > 0 && refTopicMatchWords(pat[1:], key[1:])
	default:
		return len(key) > 0 && pat[0] == key[0] && refTopicMatchWords(pat[1:], key[1:])
	}
}

// topicVisits returns how many times match visits each destination for key.
func topicVisits[D comparable](tr *topicTrie[D], key string) map[D]int {
	got := make(map[D]int)
	tr.match(key, func(d D) { got[d]++ })
	return got
}

var topicCases = []struct {
	pattern, key string
	want         bool
}{
	// `#` matches zero or more words, including the empty key.
	{"#", "", true},
	{"#", "a", true},
	{"#", "a.b.c", true},
	{"#", ".", true},
	{"#", "#", true},
	{"#.#", "", true},
	{"#.#", "a.b", true},
	{"#.#.#", "a.b", true},
	{"a.#", "a", true},
	{"a.#", "a.b.c", true},
	{"a.#", "a.", true},
	{"a.#", "b", false},
	{"a.#", "", false},
	{"#.a", "a", true},
	{"#.a", "b.a", true},
	{"#.a", ".a", true},
	{"#.a", "a.b", false},
	{"a.#.b", "a.b", true},
	{"a.#.b", "a.x.y.b", true},
	{"a.#.b", "a.x.y", false},
	{"#.b.#.c.#", "a.b.x.c", true},
	{"#.b.#.c.#", "c.b", false},

	// `*` matches exactly one word, which may be empty.
	{"*", "", false},
	{"*", "a", true},
	{"*", ".", false},
	{"*", "a.b", false},
	{"*", "*", true},
	{"*.*", ".", true},
	{"*.*", "a.b", true},
	{"*.*", "a", false},
	{"a.*.b", "a..b", true},
	{"a.*.b", "a.b", false},
	{"*.a", ".a", true},
	{"a.*", "a.", true},
	{"a.*", "a", false},

	// `#` next to `*`.
	{"*.#", "", false},
	{"*.#", "a", true},
	{"*.#", ".", true},
	{"*.#", "a.b.c", true},
	{"#.*", "", false},
	{"#.*", "a", true},
	{"#.*.#", "", false},
	{"#.*.#", ".", true},
	{"#.*.#", "a", true},
	{"*.#.*", "a", false},
	{"*.#.*", "a.b", true},
	{"*.#.*", "a.x.y.b", true},

	// Empty words, leading and trailing dots.
	{"", "", true},
	{"", "a", false},
	{"", ".", false},
	{"a", "", false},
	{".", ".", true},
	{".", "", false},
	{"a..b", "a..b", true},
	{"a..b", "a.b", false},
	{".a", ".a", true},
	{".a", "a", false},
	{"a.", "a.", true},
	{"a.", "a", false},

	// Literals: partial wildcards, case, length.
	{"a*", "a*", true},
	{"a*", "ab", false},
	{"#b", "#b", true},
	{"#b", "b", false},
	{"a", "*", false},
	{"A", "a", false},
	{"a.b", "a.b.c", false},
	{"a.b.c", "a.b", false},
}

func TestTopicMatchTable(t *testing.T) {
	for _, tc := range topicCases {
		t.Run(fmt.Sprintf("%q~%q", tc.pattern, tc.key), func(t *testing.T) {
			// The table checks the reference as well, so that the randomised tests below
			// compare against something known to be right.
			if got := refTopicMatch(tc.pattern, tc.key); got != tc.want {
				t.Errorf("refTopicMatch(%q, %q) = %v, want %v", tc.pattern, tc.key, got, tc.want)
			}
			tr := newTopicTrie[int]()
			require.True(t, tr.add(tc.pattern, 1))
			want := 0
			if tc.want {
				want = 1
			}
			if got := topicVisits(tr, tc.key)[1]; got != want {
				t.Errorf("match(%q) with binding %q visited it %d times, want %d", tc.key, tc.pattern, got, want)
			}
		})
	}
}

// TestTopicMatchAllCasesOneTrie binds every table pattern in one trie, so that the patterns
// share nodes, and checks each key against all of them at once.
func TestTopicMatchAllCasesOneTrie(t *testing.T) {
	tr := newTopicTrie[string]()
	for _, tc := range topicCases {
		tr.add(tc.pattern, tc.pattern)
	}
	for _, tc := range topicCases {
		got := topicVisits(tr, tc.key)
		want := tc.want
		if got[tc.pattern] > 1 {
			t.Errorf("match(%q) visited binding %q %d times, want at most once", tc.key, tc.pattern, got[tc.pattern])
		}
		if (got[tc.pattern] == 1) != want {
			t.Errorf("match(%q) visited %q: %v, want %v", tc.key, tc.pattern, got[tc.pattern] == 1, want)
		}
	}
}

func TestTopicMatchVisitsBindingOnce(t *testing.T) {
	tr := newTopicTrie[string]()
	// Each of these can match "a.a.a.a" in several ways.
	patterns := []string{"#.#.#", "#.a.#", "#.a.#.a.#", "#.*.#.*.#", "a.#.#.a", "#"}
	for _, p := range patterns {
		tr.add(p, p)
	}
	got := topicVisits(tr, "a.a.a.a")
	for _, p := range patterns {
		assert.Equal(t, 1, got[p], "visits of binding %q", p)
	}

	// One destination bound by two matching patterns is visited once per pattern.
	tr2 := newTopicTrie[string]()
	tr2.add("a.*", "q")
	tr2.add("#", "q")
	tr2.add("b", "q")
	assert.Equal(t, 2, topicVisits(tr2, "a.b")["q"], "visits of q bound by a.*, # and b")
}

func TestTopicMatchManyHashes(t *testing.T) {
	// A naive backtracking matcher needs about C(2n, n) steps here; the trie walk is
	// polynomial, so this finishes at once.
	pattern := strings.Repeat("#.a.", 30) + "b"
	key := strings.Repeat("a.", 60) + "c"
	tr := newTopicTrie[int]()
	tr.add(pattern, 1)
	tr.add(strings.Repeat("#.", 40)+"c", 2)
	got := topicVisits(tr, key)
	assert.Equal(t, map[int]int{2: 1}, got)
}

func TestTopicMatchLongKey(t *testing.T) {
	// Keys longer than the inline position sets (318 bytes) take the allocating path.
	for _, n := range []int{100, 159, 160, 161, 300} {
		key := strings.Repeat("a.", n) + "b" // 2n+1 bytes
		patterns := []string{"#", "#.b", "*.#", "#.a.#", "a.#.b", "#.*.*", "#.c", strings.Repeat("*.", n) + "b", strings.Repeat("*.", n) + "*.b"}
		tr := newTopicTrie[string]()
		for _, p := range patterns {
			tr.add(p, p)
		}
		got := topicVisits(tr, key)
		for _, p := range patterns {
			want := 0
			if refTopicMatch(p, key) {
				want = 1
			}
			assert.Equal(t, want, got[p], "key of %d bytes, binding %.20q", len(key), p)
		}
	}
}

func TestTopicMatchDoesNotAllocate(t *testing.T) {
	tr := newTopicTrie[int]()
	for i, p := range []string{"a.b.c", "a.*.c", "#.c", "a.#", "#.#", "*.b.*", "x.#", "#.a.#.c"} {
		tr.add(p, i)
	}
	long := strings.Repeat("a.", 127) + "c" // 255 bytes, the AMQP maximum
	n := 0
	visit := func(int) { n++ }
	allocs := testing.AllocsPerRun(100, func() {
		tr.match("a.b.c", visit)
		tr.match("", visit)
		tr.match(long, visit)
	})
	if allocs != 0 {
		t.Errorf("match allocated %v times per run, want 0", allocs)
	}
}

func TestTopicTrieAddRemove(t *testing.T) {
	tr := newTopicTrie[string]()
	require.Equal(t, 0, tr.len())

	require.True(t, tr.add("a.*", "q1"), "add(a.*, q1)")
	require.False(t, tr.add("a.*", "q1"), "add(a.*, q1) again")
	require.True(t, tr.add("a.*", "q2"), "add(a.*, q2)")
	require.True(t, tr.add("a.#", "q1"), "add(a.#, q1)")
	require.True(t, tr.add("", "q1"), "add(\"\", q1)")
	require.True(t, tr.add("#.#", "q1"), "add(#.#, q1)")
	require.True(t, tr.add("#", "q1"), "add(#, q1): not normalised with #.#")
	require.Equal(t, 6, tr.len())

	require.False(t, tr.remove("a.*", "q3"), "remove absent destination")
	require.False(t, tr.remove("a.b", "q1"), "remove absent pattern")
	require.False(t, tr.remove("a", "q1"), "remove pattern that is only a prefix")
	require.False(t, tr.remove("a.*.c", "q1"), "remove pattern longer than any bound")
	require.Equal(t, 6, tr.len())

	require.True(t, tr.remove("a.*", "q1"))
	require.False(t, tr.remove("a.*", "q1"), "remove twice")
	require.Equal(t, 5, tr.len())
	assert.Equal(t, map[string]int{"q2": 1, "q1": 3}, topicVisits(tr, "a.b"))

	require.True(t, tr.remove("", "q1"))
	assert.Equal(t, map[string]int{"q1": 2}, topicVisits(tr, ""))

	for _, b := range []struct{ p, d string }{{"a.*", "q2"}, {"a.#", "q1"}, {"#.#", "q1"}, {"#", "q1"}} {
		require.True(t, tr.remove(b.p, b.d), "remove(%q, %q)", b.p, b.d)
	}
	require.Equal(t, 0, tr.len())
	assert.Empty(t, topicVisits(tr, "a.b"))
	assert.True(t, tr.root.empty(), "root after removing everything: %+v", tr.root)
}

func TestTopicTriePrunes(t *testing.T) {
	tr := newTopicTrie[int]()
	tr.add("a.b.c", 1)
	tr.add("a.b", 2)
	tr.add("a.*.#", 3)
	tr.add("a..#", 4)
	require.Equal(t, 8, countTopicNodes(&tr.root)) // root, a, a.b, a.b.c, a.*, a.*.#, a."", a."".#

	tr.remove("a.b.c", 1)
	assert.Equal(t, 7, countTopicNodes(&tr.root), "after removing a.b.c")
	tr.remove("a.*.#", 3)
	assert.Equal(t, 5, countTopicNodes(&tr.root), "after removing a.*.#")
	assert.Nil(t, tr.root.lit["a"].star, "a.* pruned")
	tr.remove("a.b", 2)
	assert.Equal(t, 4, countTopicNodes(&tr.root), "after removing a.b")
	assert.Len(t, tr.root.lit["a"].lit, 1, "children of a")
	tr.remove("a..#", 4)
	assert.Equal(t, 1, countTopicNodes(&tr.root), "after removing everything")
	assert.Nil(t, tr.root.lit, "root literal map")
}

func countTopicNodes[D comparable](n *topicNode[D]) int {
	if n == nil {
		return 0
	}
	c := 1 + countTopicNodes(n.star) + countTopicNodes(n.hash)
	for _, ch := range n.lit {
		c += countTopicNodes(ch)
	}
	return c
}

// randomTopicString joins 0 to 5 words drawn from alphabet.
func randomTopicString(r *rand.Rand, alphabet []string) string {
	words := make([]string, r.IntN(6))
	for i := range words {
		words[i] = alphabet[r.IntN(len(alphabet))]
	}
	return strings.Join(words, ".")
}

func TestTopicMatchRandom(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	patternWords := []string{"a", "b", "", "*", "#"}
	keyWords := []string{"a", "b", "", "*", "#"} // `*` and `#` in keys are plain words

	type binding struct {
		pattern string
		id      int
	}
	for round := range 20 {
		tr := newTopicTrie[int]()
		var bound []binding
		for id := range 200 {
			b := binding{randomTopicString(r, patternWords), id}
			require.True(t, tr.add(b.pattern, b.id))
			bound = append(bound, b)
		}
		check := func(stage string) {
			t.Helper()
			require.Equal(t, len(bound), tr.len(), "round %d %s: len", round, stage)
			for range 100 {
				key := randomTopicString(r, keyWords)
				want := map[int]int{}
				for _, b := range bound {
					if refTopicMatch(b.pattern, key) {
						want[b.id] = 1
					}
				}
				got := topicVisits(tr, key)
				if !assert.Equal(t, want, got, "round %d %s: match(%q) visits by binding id", round, stage, key) {
					for id := range got {
						t.Logf("got binding %d: %q", id, bound[slices.IndexFunc(bound, func(b binding) bool { return b.id == id })].pattern)
					}
					t.FailNow()
				}
			}
		}
		check("after adds")

		// Remove a random half, then re-add some; the trie must agree with the reference
		// throughout and be the same size as one built from scratch.
		r.Shuffle(len(bound), func(i, j int) { bound[i], bound[j] = bound[j], bound[i] })
		for _, b := range bound[:100] {
			require.True(t, tr.remove(b.pattern, b.id))
			require.False(t, tr.remove(b.pattern, b.id))
		}
		bound = bound[100:]
		check("after removes")
		fresh := newTopicTrie[int]()
		for _, b := range bound {
			fresh.add(b.pattern, b.id)
		}
		require.Equal(t, countTopicNodes(&fresh.root), countTopicNodes(&tr.root), "round %d: nodes after removes vs fresh trie", round)
	}
}

// TestTopicMatchRandomSharedDestinations binds few destinations with many patterns, as a
// queue bound several times to one exchange is, and compares the deduplicated sets.
func TestTopicMatchRandomSharedDestinations(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	words := []string{"a", "b", "", "*", "#"}
	tr := newTopicTrie[string]()
	patterns := map[string][]string{} // destination → patterns
	for range 300 {
		d := fmt.Sprintf("q%d", r.IntN(10))
		p := randomTopicString(r, words)
		if tr.add(p, d) {
			patterns[d] = append(patterns[d], p)
		}
	}
	for range 500 {
		key := randomTopicString(r, words)
		want := map[string]int{}
		for d, ps := range patterns {
			for _, p := range ps {
				if refTopicMatch(p, key) {
					want[d]++
				}
			}
		}
		require.Equal(t, want, topicVisits(tr, key), "match(%q): visits per destination", key)
	}
}

func FuzzTopicMatch(f *testing.F) {
	for _, tc := range topicCases {
		f.Add(tc.pattern, tc.key)
	}
	f.Add("#.a.#.b.#", "a.a.b.b")
	f.Add("*.#.*.#", "..")
	f.Fuzz(func(t *testing.T, pattern, key string) {
		// The reference is exponential in `#` words; keep it quick.
		if strings.Count(pattern, ".") > 8 || strings.Count(key, ".") > 8 {
			t.Skip()
		}
		tr := newTopicTrie[int]()
		tr.add(pattern, 1)
		tr.add("#", 2)
		tr.add(key, 3) // a key read as a pattern matches itself unless it has wildcards
		want := 0
		if refTopicMatch(pattern, key) {
			want = 1
		}
		got := topicVisits(tr, key)
		if got[1] != want {
			t.Fatalf("match(%q) with binding %q: %d visits, want %d", key, pattern, got[1], want)
		}
		if got[2] != 1 {
			t.Fatalf("match(%q) with binding #: %d visits, want 1", key, got[2])
		}
		if want3 := refTopicMatch(key, key); (got[3] == 1) != want3 || got[3] > 1 {
			t.Fatalf("match(%q) with binding %q: %d visits, want match %v", key, key, got[3], want3)
		}
		if !tr.remove(pattern, 1) {
			t.Fatalf("remove(%q, 1) = false, want true", pattern)
		}
		if got := topicVisits(tr, key)[1]; got != 0 {
			t.Fatalf("match(%q) after remove(%q): %d visits, want 0", key, pattern, got)
		}
	})
}

func BenchmarkTopicTrieMatch10kBindings(b *testing.B) {
	// A stock-ticker-like layout: 8,000 exact bindings, 1,500 with `*`, 500 with `#`.
	tr := newTopicTrie[int]()
	id := 0
	for i := range 8000 {
		tr.add(fmt.Sprintf("stock.s%d.e%d", i%1000, i/1000), id)
		id++
	}
	for i := range 1500 {
		tr.add(fmt.Sprintf("stock.s%d.*", i), id)
		id++
	}
	for i := range 490 {
		tr.add(fmt.Sprintf("#.e%d", i), id)
		id++
	}
	for _, p := range []string{"#", "stock.#", "*.*.*", "#.*", "stock.#.e3", "#.s7.#", "*.s7.e3", "#.#", "*.#", "stock.*.#"} {
		tr.add(p, id)
		id++
	}
	if tr.len() != 10000 {
		b.Fatalf("len = %d, want 10000", tr.len())
	}
	n := 0
	visit := func(int) { n++ }
	b.ReportAllocs()
	for b.Loop() {
		tr.match("stock.s7.e3", visit)
	}
}
