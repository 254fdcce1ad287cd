package relay

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/xdsrelay/xdsrelay/internal/authz"
)

// authorizer compiles downstream.authorization.rules; nil without rules.
func (c *Config) authorizer() (*authz.Authorizer, error) {
	rules := c.Downstream.Authorization.Rules
	if len(rules) == 0 {
		return nil, nil
	}
	if c.Downstream.TLS.CAFile == "" {
		return nil, errors.New("downstream.authorization.rules: require downstream.tls.client_ca_file (mTLS): without client certificates there is no identity to check")
	}
	compiled := make([]authz.Rule, len(rules))
	for i, r := range rules {
		compiled[i] = authz.Rule(r)
	}
	a, err := authz.New(compiled)
	if err != nil {
		return nil, fmt.Errorf("downstream.authorization.%w", err)
	}
	return a, nil
}

// warnUnboundGroups warns, for each rule, about the upstream.group_by fields
// it leaves open: the clients it admits may claim any value there, and so
// join any group.
func warnUnboundGroups(cfg Config, log *slog.Logger) {
	for i, r := range cfg.Downstream.Authorization.Rules {
		for _, f := range cfg.Upstream.GroupBy {
			if _, ok := r.Node[f]; !ok {
				log.Warn("an authorization rule leaves a group_by field open: the clients it admits may join any group",
					"rule", fmt.Sprintf("downstream.authorization.rules[%d]", i), "field", f)
			}
		}
	}
}
