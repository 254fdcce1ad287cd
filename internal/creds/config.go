package creds

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
)

// ServerConfig returns a configuration for the downstream listener. Every new
// connection gets the current certificate and, when CAFile is set, must
// present a client certificate that the current CA pool verifies (mTLS).
//
// With CAFile set the configuration works through GetConfigForClient, whose
// result replaces it for the handshake: a caller that adds NextProtos must add
// them there too, as grpc's credentials.NewTLS does.
func (r *Reloader) ServerConfig() *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.serverCertificate}
	if r.t.CAFile != "" {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.GetConfigForClient = r.configForClient
	}
	return cfg
}

func (r *Reloader) serverCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := r.cur.Load().cert; c != nil {
		return c, nil
	}
	return nil, errors.New("creds: no certificate to serve")
}

// configForClient gives one connection the CA pool current when it arrives,
// since ClientCAs cannot change under a configuration in use.
func (r *Reloader) configForClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: r.serverCertificate,
		ClientAuth:     tls.RequireAndVerifyClientCert,
		ClientCAs:      r.cur.Load().pool,
	}, nil
}

// ClientConfig returns a configuration for connections to the control plane.
// Every new connection presents the current client certificate, if any, and
// verifies the server against the current CA pool (the system roots without
// CAFile), under ServerName or else the name the connection was dialled with.
//
// The name a dialler fills in for an IP address is invisible to the
// verification of a reloaded pool, so with CAFile set, connecting by IP
// address needs ServerName; ClientCredentials does not.
func (r *Reloader) ClientConfig() *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: r.t.ServerName, InsecureSkipVerify: r.t.Insecure}
	if r.t.CertFile != "" {
		cfg.GetClientCertificate = r.clientCertificate
	}
	if r.t.CAFile != "" {
		// RootCAs is fixed for the configuration's life: verify against the
		// current pool instead.
		cfg.InsecureSkipVerify = true
		cfg.VerifyConnection = r.verifyServer
	}
	return cfg
}

func (r *Reloader) clientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return r.cur.Load().cert, nil
}

// verifyServer does what crypto/tls does with RootCAs, against the current pool.
func (r *Reloader) verifyServer(cs tls.ConnectionState) error {
	name := r.t.ServerName
	if name == "" {
		name = cs.ServerName
	}
	if name == "" {
		return errors.New("creds: no server name to verify the server certificate against; set one to connect by IP address")
	}
	if len(cs.PeerCertificates) == 0 {
		return errors.New("creds: server sent no certificate")
	}
	opts := x509.VerifyOptions{Roots: r.cur.Load().pool, DNSName: name, Intermediates: x509.NewCertPool()}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(opts)
	return err
}

// handshakeConfig is ClientConfig frozen at the current material, for one
// handshake whose dialler fills in the server name.
func (r *Reloader) handshakeConfig() *tls.Config {
	m := r.cur.Load()
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: r.t.ServerName, InsecureSkipVerify: r.t.Insecure, RootCAs: m.pool}
	if m.cert != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return m.cert, nil }
	}
	return cfg
}
