package admin

// Option configures a [Server]; see [Handler].
type Option interface{ apply(*config) }

// config is a Server's settings, from defaultConfig and the options.
type config struct {
	actions bool // AllowActions
}

func defaultConfig() config { return config{} }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// AllowActions enables the requests that change the broker: purge, delete, move and publish
// (see the package doc). By default the handler is read-only.
func AllowActions() Option { return optionFunc(func(c *config) { c.actions = true }) }
