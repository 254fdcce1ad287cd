package authz

import "crypto/tls"

// Identities returns the identities of a connection's verified client
// certificate, the ones rules match: its URI SANs, its DNS SANs, then its
// subject CN. Only a certificate the TLS handshake verified counts; without
// one there is no identity.
func Identities(state *tls.ConnectionState) []string {
	if state == nil || len(state.VerifiedChains) == 0 || len(state.VerifiedChains[0]) == 0 {
		return nil
	}
	cert := state.VerifiedChains[0][0]
	var ids []string
	for _, u := range cert.URIs {
		ids = append(ids, u.String())
	}
	ids = append(ids, cert.DNSNames...)
	if cert.Subject.CommonName != "" {
		ids = append(ids, cert.Subject.CommonName)
	}
	return ids
}
