module github.com/warrenmq/warren/admin/browsertest

go 1.25.0

require (
	github.com/chromedp/chromedp v0.23.0
	github.com/warrenmq/warren v0.0.0-00010101000000-000000000000
)

require (
	github.com/chromedp/cdproto v0.160.1 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
	github.com/google/btree v1.1.3 // indirect
)

replace github.com/warrenmq/warren => ../..
