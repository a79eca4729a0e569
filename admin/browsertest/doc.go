// Package browsertest tests the admin page (github.com/warrenmq/warren/admin) in a real
// browser: headless Chromium, driven with chromedp, against a live broker. It is a module of
// its own so that chromedp stays out of the library's go.mod; it has nothing but tests.
//
// The tests run when $WARREN_BROWSER is set (CI sets it to 1 after installing Debian's
// chromium), and then fail, never skip, if Chromium cannot start; without it they skip.
// $WARREN_CHROMIUM names another Chromium than /usr/bin/chromium. To update the README's
// screenshot:
//
//	WARREN_BROWSER=1 go test -run TestAdminPage -screenshot ../../docs/admin.png
package browsertest
