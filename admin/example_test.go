package admin_test

import (
	"log"
	"net/http"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/admin"
)

// isOperator stands for the service's own check of who is asking: a session, a token, a client
// certificate.
func isOperator(r *http.Request) bool { return r.Header.Get("X-Operator") != "" }

// requireOperator is the service's own middleware: the admin handler has no authentication.
func requireOperator(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !isOperator(r) {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// The admin page under /warren/ of the service's own server, behind its own authentication,
// with the actions enabled.
func ExampleHandler() {
	b := warren.New()
	defer b.Close()
	a := admin.Handler(b, admin.AllowActions()) // read-only without AllowActions
	defer a.Close()

	mux := http.NewServeMux()
	mux.Handle("/warren/", requireOperator(http.StripPrefix("/warren", a)))
	if err := http.ListenAndServe("localhost:8080", mux); err != nil {
		log.Print(err) // and return, which closes the handler and the broker
	}
}
