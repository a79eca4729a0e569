package warren

import "time"

// Backends other than warren's own: what they need to honour warren's options the way a
// [Broker] does (contrib/rabbitmq's client is one).

// PublishSettings is what a publish's options ask for.
type PublishSettings struct {
	Mandatory  bool          // [Mandatory]
	Immediate  bool          // [Immediate]
	Delay      time.Duration // [DeliverAfter]; 0 for none
	Expiration string        // [ExpireAfter], as the Message.Expiration it sets; "" when not given
}

// ReadPublishOptions returns what opts ask for, or the error an invalid one makes a publish
// fail with (wrapping [ErrInvalidArgument]), as [Broker.Publish] reads them.
func ReadPublishOptions(opts ...PublishOption) (PublishSettings, error) {
	cfg := publishOptions(opts)
	if cfg.err != nil {
		return PublishSettings{}, cfg.err
	}
	if cfg.immediate && cfg.delay > 0 {
		return PublishSettings{}, errorf("publish: immediate with a delay: %w", ErrInvalidArgument)
	}
	s := PublishSettings{Mandatory: cfg.mandatory, Immediate: cfg.immediate, Delay: max(cfg.delay, 0)}
	if cfg.expiration != nil {
		s.Expiration = *cfg.expiration
	}
	return s, nil
}
