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
