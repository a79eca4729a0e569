package admin

import (
	"math"
	"testing"
)

// TestByteSize: sizes in binary units with one decimal, rounded half up (as admin.js's bytes
// does), a unit up once the rounding reaches 1024 of the one below.
func TestByteSize(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{
		{0, "0 B"},
		{1023, "1023 B"},
		{1024, "1.0 KiB"},
		{1280, "1.3 KiB"}, // 1.25: half up
		{1536, "1.5 KiB"},
		{1024*1024 - 52, "1023.9 KiB"},
		{1024*1024 - 51, "1.0 MiB"}, // 1023.95 KiB rounds to 1024.0
		{3 << 20, "3.0 MiB"},
		{5<<30 + 300<<20, "5.3 GiB"},
		{math.MaxInt64, "8.0 EiB"},
	} {
		if got := byteSize(c.n); got != c.want {
			t.Errorf("byteSize(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}

// TestMemoryLimitAndRatio: the limit's text and the bar's value, with and without a limit.
func TestMemoryLimitAndRatio(t *testing.T) {
	if got := memoryLimit(0); got != "no limit" {
		t.Errorf(`memoryLimit(0) = %q, want "no limit"`, got)
	}
	if got := memoryLimit(2048); got != "2.0 KiB" {
		t.Errorf(`memoryLimit(2048) = %q, want "2.0 KiB"`, got)
	}
	for _, c := range []struct {
		used, limit int64
		want        float64
	}{
		{0, 0, 0}, {500, 0, 0}, {0, 100, 0}, {25, 100, 0.25}, {100, 100, 1}, {250, 100, 1},
	} {
		if got := memoryRatio(c.used, c.limit); got != c.want {
			t.Errorf("memoryRatio(%d, %d) = %v, want %v", c.used, c.limit, got, c.want)
		}
	}
}
