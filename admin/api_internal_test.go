package admin

import (
	"reflect"
	"testing"
	"time"

	"github.com/warrenmq/warren"
)

// TestSumAddsEveryCounter: sum adds every numeric field of QueueStats (OldestAge: the largest),
// so that a counter added to QueueStats fails here until the overview's totals include it.
func TestSumAddsEveryCounter(t *testing.T) {
	var one warren.QueueStats
	v := reflect.ValueOf(&one).Elem()
	for i := range v.NumField() {
		switch f := v.Field(i); f.Kind() {
		case reflect.Int, reflect.Int64, reflect.Uint64:
			if f.CanInt() {
				f.SetInt(1)
			} else {
				f.SetUint(1)
			}
		}
	}
	got := reflect.ValueOf(sum([]warren.QueueStats{one, one}))
	for i := range got.NumField() {
		name, f := v.Type().Field(i).Name, got.Field(i)
		switch {
		case name == "OldestAge":
			if d := time.Duration(f.Int()); d != 1 {
				t.Errorf("OldestAge = %v, want the largest, 1ns", d)
			}
		case f.CanInt():
			if f.Int() != 2 {
				t.Errorf("%s = %d, want 2", name, f.Int())
			}
		case f.CanUint():
			if f.Uint() != 2 {
				t.Errorf("%s = %d, want 2", name, f.Uint())
			}
		}
	}
}

// TestReadableDepth: readable follows tables and arrays down to maxShownDepth and shows what is
// deeper as tooDeep, whatever it is given (a broker refuses deeper tables, so only a table made
// elsewhere gets there).
func TestReadableDepth(t *testing.T) {
	var v any = "bottom"
	for i := range 2 * maxShownDepth {
		if i%2 == 0 {
			v = warren.Table{"t": v}
		} else {
			v = []any{v}
		}
	}
	got := readable(v, 0)
	for depth := 0; ; depth++ {
		switch x := got.(type) {
		case map[string]any:
			got = x["t"]
			continue
		case []any:
			got = x[0]
			continue
		}
		if got != tooDeep || depth != maxShownDepth+1 {
			t.Fatalf("readable(%d nested tables and arrays) ends in %v at depth %d, want %q at %d",
				2*maxShownDepth, got, depth, tooDeep, maxShownDepth+1)
		}
		return
	}
}
