package relay

import (
	"crypto/ecdsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// What validate finds, offline, of a replica's certificate that the other
// members would refuse: each way a fleet is set up wrong, named by its
// key; nothing for a certificate they accept, or without a fleet. (A
// public CA's certificate, which the system roots verify without
// client_ca_file, is not made here.)
func TestCheckFleetCert(t *testing.T) {
	ca, other := newTestCA(t), newTestCA(t)
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	good := &x509.Certificate{Subject: pkix.Name{CommonName: "xdsrelay-peer"}, DNSNames: []string{"xdsrelay-peers"}, ExtKeyUsage: both}
	for _, tc := range []struct {
		name    string
		issuer  *testCA
		tmpl    *x509.Certificate
		peers   []string
		self    string
		ca      bool // client_ca_file set (to ca's)
		ids     []string
		wantErr []string
	}{
		{name: "accepted by name", issuer: ca, tmpl: good, peers: []string{"xdsrelay-peers:18001"}, self: "10.0.0.5:18001", ca: true, ids: []string{"xdsrelay-peer"}},
		{name: "accepted by IP", issuer: ca, self: "127.0.0.3:18001", peers: []string{"127.0.0.1:18001", "127.0.0.3:18001"}, ca: true, ids: []string{"127.0.0.3"},
			tmpl: &x509.Certificate{Subject: pkix.Name{CommonName: "127.0.0.3"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.3")}, ExtKeyUsage: both}},
		{name: "a private CA, no client_ca_file", issuer: ca, self: "127.0.0.3:18001", peers: []string{"127.0.0.1:18001", "127.0.0.3:18001"},
			tmpl:    &x509.Certificate{IPAddresses: []net.IP{net.ParseIP("127.0.0.3")}, ExtKeyUsage: both},
			wantErr: []string{"downstream.tls.client_ca_file: not set, so the other members verify this replica's certificate against the system roots"}},
		{name: "serverAuth alone", issuer: ca, peers: []string{"xdsrelay-peers:18001"}, self: "10.0.0.5:18001", ca: true, ids: []string{"xdsrelay-peer"},
			tmpl:    &x509.Certificate{Subject: pkix.Name{CommonName: "xdsrelay-peer"}, DNSNames: []string{"xdsrelay-peers"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}},
			wantErr: []string{"downstream.tls.cert_file: the certificate has no clientAuth", "downstream.tls.client_ca_file: does not verify"}},
		{name: "SAN for a name, peers by IP", issuer: ca, tmpl: good, peers: []string{"127.0.0.1:18001", "127.0.0.2:18001"}, self: "127.0.0.2:18001",
			ca: true, ids: []string{"xdsrelay-peer"},
			wantErr: []string{"downstream.tls.cert_file: the certificate is valid for none of [127.0.0.2]"}},
		{name: "peer identities that are not the certificate's", issuer: ca, tmpl: good, peers: []string{"xdsrelay-peers:18001"}, self: "10.0.0.5:18001",
			ca: true, ids: []string{"spiffe://td/ns/xdsrelay/sa/xdsrelay"}, wantErr: []string{"fleet.peer_identities: none is an identity"}},
		{name: "another CA", issuer: other, tmpl: good, peers: []string{"xdsrelay-peers:18001"}, self: "10.0.0.5:18001", ca: true, ids: []string{"xdsrelay-peer"},
			wantErr: []string{"downstream.tls.client_ca_file: does not verify"}},
		{name: "no fleet", issuer: ca, tmpl: &x509.Certificate{ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cert := tc.issuer.issue(tc.tmpl)
			dir := t.TempDir()
			kder, _ := x509.MarshalECPrivateKey(cert.PrivateKey.(*ecdsa.PrivateKey))
			cfg := Default()
			cfg.Downstream.TLS.CertFile = writePEM(t, filepath.Join(dir, "tls.crt"), "CERTIFICATE", cert.Certificate[0])
			cfg.Downstream.TLS.KeyFile = writePEM(t, filepath.Join(dir, "tls.key"), "EC PRIVATE KEY", kder)
			if tc.ca {
				cfg.Downstream.TLS.CAFile = ca.file
			}
			cfg.Fleet.Peers, cfg.Fleet.Self, cfg.Fleet.PeerIdentities = tc.peers, tc.self, tc.ids
			errs := CheckStart(cfg).TLS
			if len(errs) != len(tc.wantErr) {
				t.Fatalf("errors %v, want %d: %q", errs, len(tc.wantErr), tc.wantErr)
			}
			for i, want := range tc.wantErr {
				if !strings.Contains(errs[i].Error(), want) {
					t.Errorf("error %q, want %q", errs[i], want)
				}
			}
		})
	}
}
