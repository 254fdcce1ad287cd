package relay

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"slices"

	"github.com/xdsrelay/xdsrelay/internal/authz"
)

// checkFleetCert checks, offline, what the other members will make of
// this replica's downstream certificate, which it dials them with
// (relay/fleet.go, "Trust"): a client certificate (the clientAuth usage),
// valid for a name it is dialled at (fleet.self's host, or a name in
// fleet.peers), and, with client certificates, verified by
// downstream.tls.client_ca_file and naming an identity of
// fleet.peer_identities. A member the others refuse serves alone, and
// fetches every group itself. Nothing without the fleet and downstream
// TLS, or when the certificate does not load (CheckStart says so).
func checkFleetCert(cfg Config) []error {
	t, f := cfg.Downstream.TLS, cfg.Fleet
	if !f.On() || t.CertFile == "" {
		return nil
	}
	cert, chain, err := certChain(t.CertFile)
	if err != nil {
		return nil
	}
	var errs []error
	if len(cert.ExtKeyUsage) > 0 && !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageClientAuth) && !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageAny) {
		errs = append(errs, fmt.Errorf("downstream.tls.cert_file: the certificate has no clientAuth extended key usage, and fleet members dial each other with it (fleet.peers): the others would refuse it"))
	}
	if names := dialledAs(f.Self, f.Peers); !slices.ContainsFunc(names, func(n string) bool { return cert.VerifyHostname(n) == nil }) {
		errs = append(errs, fmt.Errorf("downstream.tls.cert_file: the certificate is valid for none of %v, the names the other members dial this one at (fleet.self's host, fleet.peers' names): they would refuse it", names))
	}
	if t.CAFile == "" {
		// The members verify each other against the system roots then.
		if _, err := cert.Verify(x509.VerifyOptions{Intermediates: chain}); err != nil {
			errs = append(errs, fmt.Errorf("downstream.tls.client_ca_file: not set, so the other members verify this replica's certificate against the system roots, which do not verify it (%w): set client_ca_file to its CA", err))
		}
		return errs
	}
	if pool, err := caPool(t.CAFile); err == nil {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, Intermediates: chain, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			errs = append(errs, fmt.Errorf("downstream.tls.client_ca_file: does not verify this replica's own certificate (downstream.tls.cert_file) as a client's, and the other members dial with it: %w", err))
		}
	}
	state := &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}
	if ids := authz.Identities(state); len(f.PeerIdentities) > 0 && !slices.ContainsFunc(ids, func(id string) bool { return slices.Contains(f.PeerIdentities, id) }) {
		errs = append(errs, fmt.Errorf("fleet.peer_identities: none is an identity of this replica's certificate (downstream.tls.cert_file: %v), which it asks the others with: they would refuse it", ids))
	}
	return errs
}

// dialledAs are the names the other members verify this one's
// certificate for: the host of fleet.self, and of each fleet.peers entry
// that is a name (an address entry names another member, or this one as
// fleet.self does).
func dialledAs(self string, peers []string) []string {
	host, _, _ := net.SplitHostPort(self)
	out := []string{host}
	for _, p := range peers {
		if h, _, err := net.SplitHostPort(p); err == nil && net.ParseIP(h) == nil && !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}

// certChain is the first certificate of a PEM file, and the others in it
// (the intermediates a server sends beside it).
func certChain(file string) (*x509.Certificate, *x509.CertPool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, err
	}
	var leaf *x509.Certificate
	chain := x509.NewCertPool()
	for {
		var b *pem.Block
		if b, data = pem.Decode(data); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, nil, err
		}
		if leaf == nil {
			leaf = c
		} else {
			chain.AddCert(c)
		}
	}
	if leaf == nil {
		return nil, nil, fmt.Errorf("%s: no certificate", file)
	}
	return leaf, chain, nil
}

// caPool is the CA bundle in file.
func caPool(file string) (*x509.CertPool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s: no certificate", file)
	}
	return pool, nil
}
