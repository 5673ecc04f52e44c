package main

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtierfs/kvtierfs/fusefs/kvevents"
)

// startKVEvents starts the publisher of the blocks that leave the store as
// vLLM KV events (the mount's tier tells it them, tiers/tier) when
// --kv-events-endpoint is set; nil when it is not.
func startKVEvents(c mountConfig, reg prometheus.Registerer, logger *slog.Logger) (*kvevents.Publisher, error) {
	if c.kvEventsEndpoint == "" {
		return nil, nil
	}
	events, err := kvevents.Start(kvevents.Options{Endpoint: c.kvEventsEndpoint, BindAll: c.kvEventsBindAll,
		Topic: c.kvEventsTopic, Logger: logger})
	if err != nil {
		return nil, err
	}
	if err := events.Register(reg); err != nil {
		events.Close()
		return nil, err
	}
	listening := "no (connects)"
	if addr := events.Addr(); addr != nil {
		listening = addr.String()
	}
	logger.Info("publishing removed blocks as KV events", "endpoint", c.kvEventsEndpoint, "listening", listening, "topic", c.kvEventsTopic)
	return events, nil
}
