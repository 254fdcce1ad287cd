package relay

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/xdsrelay/xdsrelay/internal/authz"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// The values of downstream.authorization.mode.
const (
	// AuthorizationRules, the default: with mTLS, the rules decide which
	// nodes a client may claim, and there must be some.
	AuthorizationRules = "rules"
	// AuthorizationAllowAll admits every client to every node. A choice
	// to make knowingly: it is warned about at startup.
	AuthorizationAllowAll = "allow-all"
)

// validateAuthorization checks downstream.authorization. Secure by default:
// with client certificates (mTLS) and the default mode, rules are required,
// since otherwise any certificate the CA signed could claim any node and
// read any group's resources (docs/protection.md, "Tenant isolation").
func (c *Config) validateAuthorization(p *problems) {
	a := &c.Downstream.Authorization
	switch a.Mode {
	case AuthorizationRules:
		if len(a.Rules) == 0 && c.Downstream.TLS.CAFile != "" {
			p.add(errors.New("downstream.authorization.rules: none, with downstream.tls.client_ca_file set: any client certificate could claim any node; " +
				"add downstream.authorization.rules, or set downstream.authorization.mode: allow-all (see docs/protection.md#tenant-isolation)"))
		}
	case AuthorizationAllowAll:
		if len(a.Rules) > 0 {
			p.addf("downstream.authorization.mode: allow-all admits every node, yet downstream.authorization.rules lists %d; remove the rules or set the mode to rules", len(a.Rules))
		}
	default:
		p.addf("downstream.authorization.mode: %q is neither %s nor %s", a.Mode, AuthorizationRules, AuthorizationAllowAll)
	}
	_, err := c.authorizer()
	p.add(err)
}

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
	if c.Fleet.On() {
		// A peer asks for any group its own clients were admitted to: its
		// identities may claim any node (docs/architecture.md, "Fleet").
		for _, id := range c.Fleet.PeerIdentities {
			compiled = append(compiled, authz.Rule{Identity: id})
		}
	}
	a, err := authz.New(compiled)
	if err != nil {
		return nil, fmt.Errorf("downstream.authorization.%w", err)
	}
	return a, nil
}

// warnAllowAll warns about downstream.authorization.mode: allow-all.
func (r *Relay) warnAllowAll() {
	if r.cfg.Downstream.Authorization.Mode == AuthorizationAllowAll {
		r.warnings.warn(r.log, "downstream.authorization.mode", "docs/protection.md#tenant-isolation",
			"downstream.authorization.mode is allow-all: any client may claim any node, and so join any group and read its resources")
	}
}

// warnUnboundGroups warns, for each rule, about the upstream.group_by fields
// it leaves open: the clients it admits may claim any value there, and so
// join any group.
func warnUnboundGroups(cfg Config, log *slog.Logger) {
	for i, r := range cfg.Downstream.Authorization.Rules {
		for _, f := range cfg.Upstream.GroupBy {
			if xds.IsUserAgent(f) || f == xds.FieldClientFeatures {
				continue // the client's software, not its tenant
			}
			if _, ok := r.Node[f]; !ok {
				log.Warn("an authorization rule leaves a group_by field open: the clients it admits may join any group",
					"rule", fmt.Sprintf("downstream.authorization.rules[%d]", i), "field", f)
			}
		}
	}
}
