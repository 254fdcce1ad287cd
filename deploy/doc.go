// Package deploy holds the Kubernetes manifests for xdsrelay (plain YAML,
// listed in kustomization.yaml) and the tests that decode them strictly
// into the Kubernetes API types. It is its own module so that the relay
// carries no Kubernetes dependencies.
package deploy
