package warren

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The layering rules of docs/ARCHITECTURE.md, checked on the package's source: a change that
// breaks one fails here, with the place. Each rule is also run on a snippet that breaks it, so
// that a check that cannot fail does not pass for one that holds.

// coreFiles are the queue core's files: plain data, with no lock, channel, goroutine, timer or
// broker of their own.
var coreFiles = []string{"core.go", "ready.go", "ring.go"}

// ruleViolations returns, for the Go files named by src (file name → source), every place that
// breaks a layering rule.
func ruleViolations(t *testing.T, src map[string]string) []string {
	t.Helper()
	fset := token.NewFileSet()
	var found []string
	report := func(n ast.Node, format string, args ...any) {
		found = append(found, fset.Position(n.Pos()).String()+": "+fmt.Sprintf(format, args...))
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for name := range src {
			if !yield(name) {
				return
			}
		}
	})
	for _, name := range names {
		f, err := parser.ParseFile(fset, name, src[name], 0)
		if err != nil {
			t.Fatal(err)
		}
		core := slices.Contains(coreFiles, name)
		if core {
			for _, imp := range f.Imports {
				if p := strings.Trim(imp.Path.Value, `"`); p == "sync" || p == "context" {
					report(imp, "the core imports %q", p)
				}
			}
		}
		for _, decl := range f.Decls {
			fn := "" // the enclosing function, as Recv.Name or Name
			if fd, ok := decl.(*ast.FuncDecl); ok {
				fn = fd.Name.Name
				if fd.Recv != nil {
					fn = recvName(fd.Recv.List[0].Type) + "." + fn
				}
			}
			ast.Inspect(decl, func(n ast.Node) bool {
				if what := coreBreach(n); core && what != "" {
					report(n, "the core %s", what)
				}
				switch n := n.(type) {
				case *ast.SelectorExpr:
					// q.mu.Unlock(), c.q.mu.Unlock(): a queue's lock released elsewhere than
					// through commit, view and release.
					if n.Sel.Name == "Unlock" && isQueueMu(n.X) && !slices.Contains([]string{"Queue.commit", "Queue.view", "Queue.release"}, fn) {
						report(n, "%s releases a queue's lock: leave through commit, view or release", fn)
					}
				case *ast.IncDecStmt:
					checkCounter(n.X, fn, func(what string) { report(n, "%s changes counter %s outside record", fn, what) })
				case *ast.AssignStmt:
					for _, lhs := range n.Lhs {
						checkCounter(lhs, fn, func(what string) { report(n, "%s changes counter %s outside record", fn, what) })
						if sel, ok := lhs.(*ast.SelectorExpr); ok && sel.Sel.Name == "effects" && n.Tok == token.ASSIGN &&
							len(n.Rhs) == 1 && isAppend(n.Rhs[0]) && fn != "queueCore.keep" && fn != "queueCore.note" {
							report(n, "%s appends an effect outside keep and note", fn)
						}
					}
				case *ast.CompositeLit:
					if id, ok := n.Type.(*ast.Ident); ok && id.Name == "Event" && isMessageEvent(n) &&
						fn != "Broker.flush" && fn != "Broker.publishDeadLetter" {
						report(n, "%s makes a message event outside the flush: record an effect", fn)
					}
				}
				return true
			})
		}
	}
	return found
}

// coreBreach says what n does that the core must not: start a goroutine, use a channel or a
// timer, refer to the broker or the queue's shell; "" if nothing.
func coreBreach(n ast.Node) string {
	switch n := n.(type) {
	case *ast.GoStmt:
		return "starts a goroutine"
	case *ast.SelectStmt:
		return "selects on channels"
	case *ast.ChanType:
		return "has a channel"
	case *ast.SendStmt:
		return "sends on a channel"
	case *ast.Ident:
		if n.Name == "Broker" || n.Name == "Queue" {
			return "refers to " + n.Name
		}
	case *ast.SelectorExpr:
		if x, ok := n.X.(*ast.Ident); ok && x.Name == "time" &&
			(n.Sel.Name == "AfterFunc" || n.Sel.Name == "NewTimer" || n.Sel.Name == "Sleep") {
			return "uses time." + n.Sel.Name
		}
	}
	return ""
}

// recvName returns the type name of a method's receiver.
func recvName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return recvName(e.X)
	case *ast.IndexExpr:
		return recvName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return ""
}

// isQueueMu reports whether e is a queue's mutex as the package names it: q.mu, or x.q.mu.
func isQueueMu(e ast.Expr) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "mu" {
		return false
	}
	switch x := sel.X.(type) {
	case *ast.Ident:
		return x.Name == "q"
	case *ast.SelectorExpr:
		return x.Sel.Name == "q"
	}
	return false
}

// checkCounter calls bad if e is a counter of the core's (x.n.field) and fn may not change it.
func checkCounter(e ast.Expr, fn string, bad func(string)) {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return
	}
	n, ok := sel.X.(*ast.SelectorExpr)
	if !ok || n.Sel.Name != "n" {
		return
	}
	if !strings.HasPrefix(fn, "queueCore.record") && fn != "queueCore.count" && fn != "queueCore.deadLettered" &&
		fn != "queueCore.enqueued" {
		bad(sel.Sel.Name)
	}
}

func isAppend(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	id, ok := call.Fun.(*ast.Ident)
	return ok && id.Name == "append"
}

// isMessageEvent reports whether an Event literal is about a message in a queue: one of the
// message lifecycle kinds, or a kind not known until it runs with a message.
func isMessageEvent(lit *ast.CompositeLit) bool {
	var kind ast.Expr
	message := false
	for _, el := range lit.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		switch k, _ := kv.Key.(*ast.Ident); {
		case k == nil:
		case k.Name == "Kind":
			kind = kv.Value
		case k.Name == "Message":
			message = true
		}
	}
	id, ok := kind.(*ast.Ident)
	if !ok || !strings.HasPrefix(id.Name, "Event") {
		return kind != nil && message
	}
	switch id.Name {
	case "EventEnqueued", "EventDelivered", "EventAcked", "EventRequeued", "EventExpired",
		"EventDeadLettered", "EventDropped":
		return true
	}
	return false
}

func TestArchitectureRules(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	src := map[string]string{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		src[name] = string(b)
	}
	for _, name := range coreFiles {
		if _, ok := src[name]; !ok {
			t.Fatalf("core file %s is missing: update coreFiles", name)
		}
	}
	for _, v := range ruleViolations(t, src) {
		t.Error(v)
	}
}

// TestArchitectureRulesCatch runs each rule on code that breaks it.
func TestArchitectureRulesCatch(t *testing.T) {
	for _, tc := range []struct {
		name, file, src, want string
	}{
		{"goroutine in the core", "core.go", `package warren
func (c *queueCore) f() { go func() {}() }`, "starts a goroutine"},
		{"channel in the core", "ready.go", `package warren
type x struct{ ch chan int }`, "has a channel"},
		{"lock in the core", "core.go", `package warren
import "sync"
var mu sync.Mutex`, `imports "sync"`},
		{"broker in the core", "core.go", `package warren
type y struct{ b *Broker }`, "refers to Broker"},
		{"timer in the core", "ring.go", `package warren
import "time"
func f() { time.AfterFunc(0, nil) }`, "time.AfterFunc"},
		{"counter outside record", "queue.go", `package warren
func (q *Queue) f() { q.core.n.acked++ }`, "changes counter acked"},
		{"counter added to outside record", "dispatch.go", `package warren
func (c *queueCore) g() { c.n.dropped += 2 }`, "changes counter dropped"},
		{"message event outside the flush", "consumer.go", `package warren
func (q *Queue) f() { q.eventLocked(Event{Kind: EventAcked}) }`, "message event outside the flush"},
		{"message event of a kind known when it runs", "serve.go", `package warren
func (q *Queue) f(k EventKind, m *Message) { q.eventLocked(Event{Kind: k, Message: m}) }`, "message event outside the flush"},
		{"effect appended outside record", "consumer.go", `package warren
func (q *Queue) f() { q.core.effects = append(q.core.effects, effect{}) }`, "appends an effect"},
		{"queue lock released elsewhere", "consumer.go", `package warren
func (c *Consumer) f() { c.q.mu.Lock(); c.q.mu.Unlock() }`, "releases a queue's lock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			found := ruleViolations(t, map[string]string{tc.file: tc.src})
			if !slices.ContainsFunc(found, func(v string) bool { return strings.Contains(v, tc.want) }) {
				t.Errorf("want a violation %q, got %q", tc.want, found)
			}
		})
	}
}
