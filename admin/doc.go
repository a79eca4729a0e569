// Package admin is an operator's view of a [warren.Broker] over HTTP: a JSON API and an HTML
// page on the same data, as an [http.Handler] to mount in the application's own server under
// any prefix. It uses the standard library only, and its page loads nothing from the network.
//
//	a := admin.Handler(b, admin.AllowActions())
//	defer a.Close()
//	mux.Handle("/warren/", http.StripPrefix("/warren", a))
//
// # What it shows
//
// The JSON API (GET, under the mount point):
//
//	/api/overview                 the broker's totals (queue counters summed), exchange and queue counts,
//	                              and its memory budget ([warren.Broker.Memory]): "memory": {"used",
//	                              "limit" (0: none), "alarm", "waiting" (publishes), "alarms"}
//	/api/queues                   every queue: its stats, flags and arguments
//	/api/queues/{name}            one queue, and its consumers ([warren.Queue.Consumers])
//	/api/queues/{name}/messages   its ready messages, a page at a time (?after=ID&limit=N), not consumed;
//	                              refused for an exclusive queue (423), whose messages are its owner's
//	/api/exchanges                exchanges, the predeclared ones included
//	/api/bindings                 bindings, exchange to queue and exchange to exchange
//	/api/token                    the token that actions need (see Safety)
//	/api/stream                   server-sent events: a "sample" a second (?queue=name: of that queue only),
//	                              with the rates, the totals and the memory budget as the overview has it
//
// A name in a path is escaped as a path segment (url.PathEscape: "a/b" is "a%2Fb"). Every route
// with a queue's {name} has a twin that takes the name in the query instead, without the
// segment and without the plural: /api/queue?name=…, /api/queue/messages?name=…, and so on,
// and the page /queue?name=…. It reaches every queue; it is the only way to the queues named
// ".", ".." and "/", whose segments browsers and most HTTP clients remove from a path ("." and
// "..", escaped or not) or http.ServeMux does not route ("%2F"); the page links to those so.
// Errors come as {"error": "…"} with a status from the broker's error: 404 for
// [warren.ErrNotFound], 409 for a precondition or a refused move, 423 for an exclusive queue,
// 400 for a bad request.
//
// Looking does not use: the handler finds a queue by listing them ([warren.Broker.Queues]), not
// with [warren.Broker.Queue], which counts as a use and would keep a queue with
// [warren.Expires] alive. Messages are read with [warren.Queue.BrowseFrom] one at a time, so
// that a look at a long queue holds its lock for a seek and one entry's copy at a time (the
// message is built after the lock is released), never for a whole page.
//
// The page (GET / , /queues/{name}, /topology) shows the same: an overview with live rates,
// the broker's memory (used of the limit, as a bar, or "no limit") and, while its memory alarm
// is set ([warren.WithMemoryLimit]), a banner that says publishers are blocked and how many
// publishes wait, the queues with their depth and a small chart of it, a queue with its message browser and
// actions (an exclusive queue with neither: its stats and consumers only, and why), and the
// topology, exchanges to bindings to queues. Its links are relative, so it
// works under any prefix; its script and stylesheet are embedded, and its Content-Security-Policy
// lets it load nothing else and be framed by nothing.
//
// An exclusive queue's messages are its owner's business, as its arguments and bindings are
// already: the handler, which acts on behalf of no owner, shows its stats and consumers, and
// refuses to browse, move, purge or delete it: 423 (Locked), as for every
// [warren.ErrResourceLocked]. RabbitMQ's management refuses the same: its get from an exclusive
// queue fails on the channel with 405 RESOURCE_LOCKED, which it answers as an HTTP 400 with
// that reason.
//
// The live view costs nothing until someone watches: while a page (or any client of
// /api/stream) is open, the handler has one [warren.Broker.Listen] listener, which counts
// events by kind with an atomic add, and one goroutine, which each second turns the counts into
// rates and reads every queue's [warren.Queue.Stats] for depths and per-queue rates. Both go
// when the last stream closes.
//
// # Actions
//
// With [AllowActions], these POST requests change the broker:
//
//	/api/queues/{name}/purge      removes its ready messages ([warren.Queue.Purge])
//	/api/queues/{name}/delete     deletes it; {"if_unused": true, "if_empty": true} as for [warren.Broker.DeleteQueue]
//	/api/queues/{name}/move       moves its ready messages ([warren.Queue.Move]): {"queue": "orders"}, or
//	                              {"exchange": "x", "routing_key": "k"}; all of them, {"limit": N}, or {"ids": [...]}
//	/api/publish                  publishes a test message: {"exchange", "routing_key", "body",
//	                              "content_type", "headers": {"k": "v"}, "persistent", "mandatory"}
//
// Without it, the handler is read-only: those requests get 403 and the page shows no buttons.
//
// # Safety
//
// The handler has no authentication of its own: wrap it in the application's, as for any other
// endpoint of the service.
//
//	mux.Handle("/warren/", requireOperator(http.StripPrefix("/warren", a)))
//
// An action must pass two checks against cross-site request forgery. The request must not come
// from another origin, as [http.CrossOriginProtection] tells from the Sec-Fetch-Site or Origin
// header browsers send. And it must carry the handler's token in the X-CSRF-Token header: a
// random value made when the handler is, written into the page and returned by /api/token. A
// page of another origin can neither read the token nor, without the service's CORS consent,
// send a custom header; and the token still holds where a browser sends neither header the
// first check reads. A script calls GET /api/token once, then sends the header.
//
// A Server is safe for concurrent use. [Server.Close] ends its event stream; the rest keeps
// answering.
package admin
