package creds

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
)

// TLS describes one side's TLS settings, as the configuration gives them.
type TLS struct {
	// CertFile and KeyFile hold our certificate: the server certificate
	// downstream, the client certificate (mTLS) upstream.
	CertFile, KeyFile string
	// CAFile is the CA bundle that verifies the peer: upstream, the control
	// plane's CA (the system roots when empty); downstream, the CA of client
	// certificates, which are then required (mTLS).
	CAFile string
	// ServerName, upstream only, overrides the name verified in the server
	// certificate (and the authority gRPC sends).
	ServerName string
	// Insecure, upstream only, skips verifying the server. For tests and
	// development; the caller logs it loudly.
	Insecure bool
}

// Enabled reports whether any TLS setting is given.
func (t TLS) Enabled() bool { return t != TLS{} }

func (t TLS) validate() error {
	switch {
	case !t.Enabled():
		return errors.New("creds: no TLS settings")
	case t.CertFile != "" && t.KeyFile == "":
		return &FileError{KeyFile, errors.New("creds: a certificate file and a key file go together: no key file")}
	case t.CertFile == "" && t.KeyFile != "":
		return &FileError{CertFile, errors.New("creds: a certificate file and a key file go together: no certificate file")}
	case t.Insecure && t.CAFile != "":
		return errors.New("creds: insecure skips verification, so a CA file would be ignored")
	}
	return nil
}

// material is what the files held at one load; immutable once stored.
type material struct {
	cert *tls.Certificate // nil without CertFile
	pool *x509.CertPool   // nil without CAFile
	raw  [3][]byte        // certificate, key and CA files as read, to tell a change from a touch
}

func (m *material) same(o *material) bool {
	for i := range m.raw {
		if !bytes.Equal(m.raw[i], o.raw[i]) {
			return false
		}
	}
	return true
}

// FileError is a file of TLS settings that does not load: the certificate
// (File CertFile), its key (KeyFile) or the CA bundle (CAFile), so that the
// caller names the setting.
type FileError struct {
	File File
	Err  error
}

// File names one of the files of TLS.
type File int

// The files of TLS.
const (
	CertFile File = iota
	KeyFile
	CAFile
)

func (e *FileError) Error() string { return e.Err.Error() }
func (e *FileError) Unwrap() error { return e.Err }

// Check checks t and loads its files once, as NewReloader does, watching
// nothing.
func Check(t TLS) error {
	if err := t.validate(); err != nil {
		return err
	}
	_, err := load(t)
	return err
}

// CheckEach is Check reporting every file that does not load, not the
// first: the certificate, its key, whether they pair (when both load),
// and the CA bundle, each on its own.
func CheckEach(t TLS) []error {
	if err := t.validate(); err != nil {
		return []error{err}
	}
	var errs []error
	if t.CertFile != "" {
		certPEM, certErr := readCert(t.CertFile)
		keyPEM, keyErr := readKey(t.KeyFile)
		errs = appendErr(appendErr(errs, certErr), keyErr)
		if certErr == nil && keyErr == nil {
			_, err := keyPair(t.CertFile, t.KeyFile, certPEM, keyPEM)
			errs = appendErr(errs, err)
		}
	}
	if t.CAFile != "" {
		_, _, err := readCA(t.CAFile)
		errs = appendErr(errs, err)
	}
	return errs
}

func appendErr(errs []error, err error) []error {
	if err != nil {
		return append(errs, err)
	}
	return errs
}

// load reads every file t names; an error names the file that does not load.
func load(t TLS) (*material, error) {
	m := &material{}
	if t.CertFile != "" {
		cert, certPEM, keyPEM, err := loadKeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, err
		}
		m.cert, m.raw[0], m.raw[1] = cert, certPEM, keyPEM
	}
	if t.CAFile != "" {
		pool, caPEM, err := readCA(t.CAFile)
		if err != nil {
			return nil, err
		}
		m.pool, m.raw[2] = pool, caPEM
	}
	return m, nil
}

func loadKeyPair(certFile, keyFile string) (_ *tls.Certificate, certPEM, keyPEM []byte, _ error) {
	certPEM, err := readCert(certFile)
	if err != nil {
		return nil, nil, nil, err
	}
	keyPEM, err = readKey(keyFile)
	if err != nil {
		return nil, nil, nil, err
	}
	cert, err := keyPair(certFile, keyFile, certPEM, keyPEM)
	return cert, certPEM, keyPEM, err
}

// readCert reads a certificate file, which must hold a certificate.
func readCert(file string) ([]byte, error) {
	certPEM, err := os.ReadFile(file)
	if err != nil {
		return nil, &FileError{CertFile, fmt.Errorf("creds: certificate: %w", err)}
	}
	if _, err := parseCerts(certPEM); err != nil {
		return nil, &FileError{CertFile, fmt.Errorf("creds: certificate %s: %w", file, err)}
	}
	return certPEM, nil
}

// readKey reads a key file, which must hold a private key.
func readKey(file string) ([]byte, error) {
	keyPEM, err := os.ReadFile(file)
	if err != nil {
		return nil, &FileError{KeyFile, fmt.Errorf("creds: key: %w", err)}
	}
	if !hasKey(keyPEM) {
		return nil, &FileError{KeyFile, fmt.Errorf("creds: key %s: no PEM private key", file)}
	}
	return keyPEM, nil
}

// keyPair makes the certificate of a certificate and its key.
func keyPair(certFile, keyFile string, certPEM, keyPEM []byte) (*tls.Certificate, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, &FileError{KeyFile, fmt.Errorf("creds: key %s for certificate %s: %w", keyFile, certFile, err)}
	}
	return &cert, nil
}

// readCA reads a CA bundle, which must hold a certificate.
func readCA(file string) (*x509.CertPool, []byte, error) {
	caPEM, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, &FileError{CAFile, fmt.Errorf("creds: CA: %w", err)}
	}
	certs, err := parseCerts(caPEM)
	if err != nil {
		return nil, nil, &FileError{CAFile, fmt.Errorf("creds: CA %s: %w", file, err)}
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, caPEM, nil
}

// parseCerts returns every certificate in data, which must hold at least one.
func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return certs, nil
}

func hasKey(data []byte) bool {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return false
		}
		if b.Type == "PRIVATE KEY" || strings.HasSuffix(b.Type, " PRIVATE KEY") {
			return true
		}
	}
}
