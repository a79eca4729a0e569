package browsertest

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/admin"
)

// browserEnv, set (CI sets it to 1), makes the tests run, and fail if Chromium cannot start;
// unset, they skip.
const browserEnv = "WARREN_BROWSER"

var screenshot = flag.String("screenshot", "", "also save the overview's screenshot to this file (the README's is ../../docs/admin.png)")

// browser starts a headless Chromium for the test, or skips the test when $WARREN_BROWSER is
// not set. The flags keep it off the network (this machine's is closed, and Chromium stalls on
// its background fetches without them) and in a profile of its own. The context ends with the
// test, which stops the browser.
func browser(t *testing.T) context.Context {
	t.Helper()
	if os.Getenv(browserEnv) == "" {
		t.Skipf("$%s is not set: no browser test (CI sets it; needs Debian's chromium)", browserEnv)
	}
	exe := os.Getenv("WARREN_CHROMIUM")
	if exe == "" {
		exe = "/usr/bin/chromium"
	}
	output := &lockedBuffer{}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(exe),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 860),
		chromedp.CombinedOutput(output),
	)
	ctx, cancel := chromedp.NewContext(alloc, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	// Start it now, without a deadline (a deadline on the first run would end the browser).
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s (set $WARREN_CHROMIUM for another; apt-get install chromium): %v\n%s", exe, err, output)
	}
	version, err := chromedp.Run(ctx, chromedp.Evaluate[string]("navigator.userAgent"))
	if err != nil {
		t.Fatalf("%s: %v\n%s", exe, err, output)
	}
	t.Logf("browser: %s", version)

	// Every uncaught exception and console error of the page fails the test.
	// The watcher ends with ctx, before the test does.
	messages := chromedp.Console(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for m, err := range messages {
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("browser console: %v", err)
				}
				return
			}
			if m.IsException() || m.Type == chromedp.ConsoleError {
				t.Errorf("browser console: %s (%s:%d)", m, m.URL, m.Line)
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-watched
	})
	return ctx
}

// lockedBuffer collects Chromium's output, written from another goroutine.
type lockedBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// demo is a broker with the topology the test looks at: orders dead-letters into orders.dlq,
// where three rejected orders wait; emails has traffic, published and consumed all along, for
// the live rates.
func demo(t *testing.T) *warren.Broker {
	t.Helper()
	b := warren.New()
	t.Cleanup(func() { b.Close() })
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := b.DeclareQueue("orders.dlq", warren.Durable())
	must(err)
	orders, err := b.DeclareQueue("orders", warren.Durable(), warren.DeadLetter("", "orders.dlq"))
	must(err)
	emails, err := b.DeclareQueue("emails", warren.MaxLength(10_000))
	must(err)
	_, err = b.DeclareExchange("shop", warren.ExchangeTopic, warren.Durable())
	must(err)
	must(b.Bind("orders", "shop", "order.*", nil))
	must(b.Bind("emails", "shop", "user.#", nil))
	ctx := t.Context()
	for i := range 3 {
		must(b.Publish(ctx, "shop", "order.created", warren.Message{ContentType: "application/json",
			MessageID: fmt.Sprint("order-", 41+i), Body: fmt.Appendf(nil, `{"order": %d, "total": "%d.90"}`, 41+i, 10*i+9)}))
		d, err := orders.Get(ctx)
		must(err)
		must(d.Reject())
	}
	for i := range 120 {
		must(b.Publish(ctx, "shop", "user.signup", warren.Message{Body: fmt.Appendf(nil, "welcome %d", i)}))
	}

	// Traffic: about 50 publishes a second into emails, and a consumer that keeps up with
	// most of it, until the test ends.
	c, err := emails.Consume(ctx, warren.Prefetch(10))
	must(err)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			b.Publish(ctx, "shop", "user.signup", warren.Message{Body: fmt.Appendf(nil, "welcome %d", i)})
		}
	})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case d, ok := <-c.Deliveries():
				if !ok {
					return
				}
				if i%5 != 4 {
					d.Ack()
				} else {
					d.Nack()
				}
			}
		}
	})
	return b
}

// serveAdmin serves b's admin handler, with actions, under /warren/ on a test server that the
// test closes.
func serveAdmin(t *testing.T, b *warren.Broker) *httptest.Server {
	a := admin.Handler(b, admin.AllowActions())
	mux := http.NewServeMux()
	mux.Handle("/warren/", http.StripPrefix("/warren", a))
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		a.Close() // ends the page's event stream, which srv.Close would wait for
		srv.Close()
	})
	return srv
}

// stepper returns a function that runs browser steps in ctx, within 30 s, and fails the test
// with what when they fail.
func stepper(t *testing.T, ctx context.Context) func(what string, steps ...chromedp.Action[chromedp.Void]) {
	return func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(sctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
}

// waitFor waits, up to 15 s, until the expression is true in ctx's page, or fails the test with
// failure's text: the page updates live, and reloads after an action (an evaluation that meets
// the reload fails, and is tried again).
func waitFor(t *testing.T, ctx context.Context, expr string, failure func() string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s (%v)", failure(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAdminPage loads the admin page against a live broker in headless Chromium: the overview
// lists the queues with their counts and goes live; a queue's page shows its dead letters with
// their x-death; moving one back to orders by clicking changes the counts, on the page and in
// the broker.
func TestAdminPage(t *testing.T) {
	ctx := browser(t)
	b := demo(t)
	srv := serveAdmin(t, b)
	step := stepper(t, ctx)
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	waitText := func(sel, want string) {
		t.Helper()
		waitFor(t, ctx, fmt.Sprintf(`(document.querySelector(%q) || {}).textContent === %q`, sel, want), func() string {
			return fmt.Sprintf("%s: want %q, have %q", sel, want, text(sel))
		})
	}
	ready := func(queue string) string { return `tr[data-queue="` + queue + `"] [data-field="ready"]` }

	// The overview: every queue with its counts, then live.
	step("load the overview", chromedp.Navigate(srv.URL+"/warren/"), chromedp.WaitVisible(chromedp.CSS(`tr[data-queue="orders.dlq"]`)))
	for _, q := range []string{"emails", "orders", "orders.dlq"} {
		step("find queue "+q, chromedp.WaitVisible(chromedp.CSS(`tr[data-queue="`+q+`"] a`)))
	}
	if got := text(ready("orders.dlq")); got != "3" {
		t.Errorf("orders.dlq shows %q ready, want 3", got)
	}
	if got := text(ready("orders")); got != "0" {
		t.Errorf("orders shows %q ready, want 0", got)
	}
	step("go live", chromedp.WaitVisible(chromedp.CSS(`#live.on`)))
	// A rate appears once the stream's first sample arrives (the traffic publishes all along).
	waitFor(t, ctx, `Number(document.querySelector('[data-rate="published"]').textContent) > 0`, func() string {
		return fmt.Sprintf("no live publish rate: %q", text(`[data-rate="published"]`))
	})

	// The dead-letter queue's page: its messages with their x-death; move the second back.
	step("open orders.dlq", chromedp.Click(chromedp.CSS(`tr[data-queue="orders.dlq"] a`)), chromedp.WaitVisible(chromedp.CSS(`tr[data-id]`)))
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("tr[data-id]").length`))
	if err != nil || rows != 3 {
		t.Fatalf("orders.dlq lists %d messages (%v), want 3", rows, err)
	}
	if got := text(`tr[data-id] td.deaths`); !strings.Contains(got, "rejected ×1 from orders") {
		t.Errorf("x-death shown as %q, want it to say rejected ×1 from orders", got)
	}
	second, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelectorAll("tr[data-id]")[1].dataset.id`))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("move-to").value`)); got != "orders" {
		t.Errorf("a move offers %q first (%v), want orders, where the messages died", got, err)
	}
	step("move message "+second+" back to orders",
		chromedp.Click(chromedp.CSS(`input.select[value="`+second+`"]`)),
		chromedp.Click(chromedp.CSS(`button[data-action="move-selected"]`)))
	waitText("#status", "moved 1")
	waitText("#ready", "2")
	rows, err = chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("tr[data-id]").length`))
	if err != nil || rows != 2 {
		t.Errorf("after the move orders.dlq lists %d messages (%v), want 2", rows, err)
	}

	// The broker agrees: the message is in orders, with its x-death.
	var moved *warren.Message
	for q := range b.Queues() {
		if q.Name() == "orders" {
			if page := q.BrowseFrom(0, 10); len(page) == 1 {
				moved = page[0].Message
			}
		}
	}
	if moved == nil {
		t.Fatal("orders does not hold the one moved message")
	}
	if moved.MessageID != "order-42" || len(moved.Deaths()) != 1 {
		t.Errorf("moved %s with deaths %v, want order-42 with its x-death", moved.MessageID, moved.Deaths())
	}

	// Back on the overview the counts have changed; let the charts fill for the screenshot.
	step("back to the overview", chromedp.Navigate(srv.URL+"/warren/"), chromedp.WaitVisible(chromedp.CSS(`#live.on`)))
	waitText(ready("orders"), "1")
	waitText(ready("orders.dlq"), "2")
	step("let the charts fill", chromedp.Sleep(6*time.Second))
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	path := *screenshot
	if path == "" {
		path = filepath.Join(t.TempDir(), "admin.png")
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(png))

	step("topology", chromedp.Navigate(srv.URL+"/warren/topology"), chromedp.WaitVisible(chromedp.CSS(`a.queue[href="queues/orders"]`)))
}

// TestQueuesNamedAsPaths: the queues named ".." and "/", which a browser cannot reach by a path
// segment (it removes ".." and "%2E%2E" as a dot segment; http.ServeMux does not route "%2F"),
// are reached from the overview's links, and the page's move action works on them.
func TestQueuesNamedAsPaths(t *testing.T) {
	ctx := browser(t)
	b := warren.New()
	t.Cleanup(func() { b.Close() })
	for _, name := range []string{"..", "/"} {
		if _, err := b.DeclareQueue(name); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		if err := b.Publish(t.Context(), "", "..", warren.Message{Body: fmt.Appendf(nil, "m%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	srv := serveAdmin(t, b)
	run := stepper(t, ctx)
	heading := func() string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("h1")))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(s)
	}

	run("open queue ..", chromedp.Navigate(srv.URL+"/warren/"),
		chromedp.Click(chromedp.CSS(`tr[data-queue=".."] a`)), chromedp.WaitVisible(chromedp.CSS(`tr[data-id]`)))
	if got := heading(); got != "Queue .." {
		t.Fatalf("the link to .. leads to %q", got)
	}
	run("move all to /", chromedp.SetValue(chromedp.CSS("#move-to"), "/"),
		chromedp.Click(chromedp.CSS(`button[data-action="move-all"]`)))
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.getElementById("status") || {}).textContent`))
		if err == nil && got == "moved 2" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("moving all of .. to / says %q (%v), want moved 2", got, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	run("open queue /", chromedp.Navigate(srv.URL+"/warren/"),
		chromedp.Click(chromedp.CSS(`tr[data-queue="/"] a`)), chromedp.WaitVisible(chromedp.CSS(`tr[data-id]`)))
	if got := heading(); got != "Queue /" {
		t.Fatalf("the link to / leads to %q", got)
	}
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("tr[data-id]").length`))
	if err != nil || rows != 2 {
		t.Errorf("/ lists %d messages (%v), want the 2 moved", rows, err)
	}
}

// TestMemoryAlarmBanner: the overview shows the broker's memory, used of the limit, and follows
// its memory alarm live: when the broker goes over its limit and a publish waits, a banner
// appears that says publishers are blocked and how many wait; when the queue is drained it goes
// away. The live view formats sizes as the server does.
func TestMemoryAlarmBanner(t *testing.T) {
	ctx := browser(t)
	m := warren.Message{Body: make([]byte, 1500)}
	one := footprint(t, m)
	limit := one + one/2 // one message fits, two do not
	b := warren.New(warren.WithMemoryLimit(limit))
	t.Cleanup(func() { b.Close() })
	q, err := b.DeclareQueue("q")
	if err != nil {
		t.Fatal(err)
	}
	srv := serveAdmin(t, b)
	step := stepper(t, ctx)
	eval := func(expr string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		return s
	}
	memory := func(field string) string {
		return eval(`document.querySelector('#memory [data-memory="` + field + `"]').textContent`)
	}
	banner := `document.getElementById("memory-alarm")`

	step("load the overview", chromedp.Navigate(srv.URL+"/warren/"), chromedp.WaitVisible(chromedp.CSS(`#memory`)),
		chromedp.WaitVisible(chromedp.CSS(`#live.on`)), chromedp.WaitNotVisible(chromedp.CSS(`#memory-alarm`)))
	if got := memory("used"); got != "0 B" {
		t.Errorf("memory used shows %q, want 0 B", got)
	}

	for range 2 {
		if err := b.Publish(t.Context(), "", "q", m); err != nil {
			t.Fatal(err)
		}
	}
	published := make(chan error, 1)
	go func() { published <- b.Publish(t.Context(), "", "q", m) }() // waits for the alarm to clear
	step("the banner appears", chromedp.WaitVisible(chromedp.CSS(`#memory-alarm`)))
	if got := eval(banner + `.textContent.replace(/\s+/g, " ").trim()`); !strings.HasPrefix(got, "memory alarm: publishers blocked 1 waiting") {
		t.Errorf("the banner says %q", got)
	}
	if got := eval(`String(document.getElementById("memory-bar").value)`); got != "1" {
		t.Errorf("the bar is at %s, want full", got)
	}
	// The page as the server renders it now (nothing changes while the publish waits) says what
	// the live view says.
	res, err := http.Get(srv.URL + "/warren/")
	if err != nil {
		t.Fatal(err)
	}
	page, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"used", "limit", "alarms"} {
		rendered := regexp.MustCompile(`<span data-memory="` + field + `">([^<]*)<`).FindSubmatch(page)
		if rendered == nil {
			t.Fatalf("the server's page has no memory %s", field)
		}
		if got := memory(field); got != string(rendered[1]) {
			t.Errorf("memory %s shows %q live, %q from the server", field, got, rendered[1])
		}
	}

	// Drained: the broker is back under its limit, the waiting publish goes in, and stays under.
	if _, err := q.Purge(); err != nil {
		t.Fatal(err)
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	step("the banner goes away", chromedp.WaitNotVisible(chromedp.CSS(`#memory-alarm`)))
	waitFor(t, ctx, banner+`.querySelector('[data-memory="waiting"]').textContent === "0"`, func() string {
		return "the banner still counts " + eval(banner+`.querySelector('[data-memory="waiting"]').textContent`) + " waiting"
	})
	if got := memory("alarms"); got != "1" {
		t.Errorf("alarms shows %q, want 1", got)
	}
}

// footprint returns what one message m costs a broker's memory budget: it publishes m on a
// broker with no limit and reads Broker.Memory.
func footprint(t *testing.T, m warren.Message) int64 {
	t.Helper()
	b := warren.New(warren.WithMemoryLimit(warren.NoMemoryLimit))
	defer b.Close()
	if _, err := b.DeclareQueue("q"); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(t.Context(), "", "q", m); err != nil {
		t.Fatal(err)
	}
	return b.Memory().Used
}
