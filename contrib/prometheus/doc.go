// Package warrenprom exposes a [warren.Broker]'s statistics as Prometheus metrics.
//
// The import path is github.com/warrenmq/warren/contrib/prometheus, but the package is named
// warrenprom, so that it can be imported next to client_golang's prometheus package without
// an alias.
//
// [NewCollector] returns a [prometheus.Collector]. Each scrape takes one snapshot with
// [warren.Broker.Stats], which reads each queue in one short critical section, and exposes
// per-queue gauges and counters labelled by queue name, plus the broker's exchange count,
// unroutable publishes and memory budget (used, limit, alarm, waiting publishes, alarms); see
// [NewCollector] for the list. Nothing runs between scrapes: the
// collector holds no state but the broker.
//
//	b := warren.New()
//	defer b.Close()
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(warrenprom.NewCollector(b))
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// A scrape then reads, among others:
//
//	# HELP warren_queue_messages_acked_total Deliveries from the queue acknowledged, auto-acked ones included.
//	# TYPE warren_queue_messages_acked_total counter
//	warren_queue_messages_acked_total{queue="orders"} 3
//
// [WithNamespace] changes the "warren" prefix; [WithConstLabels] adds fixed labels, to tell
// several brokers in one registry apart.
package warrenprom
