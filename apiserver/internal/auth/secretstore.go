package auth

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The shape of an API-key Secret. CreateKey writes exactly this; an operator
// may write it by hand too (see CreateKey).
const (
	// LabelAPIKey marks a Secret as an API key; any value counts, CreateKey
	// writes "true". Only Secrets with this label are read.
	LabelAPIKey = "skiff.dev/api-key"
	// SecretDigestField is the data field holding the key's SHA-256 digest
	// as 64 hex characters (see Hash).
	SecretDigestField = "sha256"
	// AnnotationKeyPrefix holds the key's first 8 characters ("e2b_" and 4
	// hex), so a human can tell which Secret is which key.
	AnnotationKeyPrefix = "skiff.dev/api-key-prefix"
	// SecretType is the type CreateKey gives the Secret. Lookups do not
	// require it, so hand-made Opaque Secrets work too.
	SecretType corev1.SecretType = "skiff.dev/api-key"
	// SecretGenerateName prefixes the names of the Secrets CreateKey makes.
	SecretGenerateName = "e2b-key-"

	// digestIndex is the cache field index from a key digest to its Secrets.
	digestIndex = "skiff.dev/api-key-sha256"
)

// SecretCache is what a SecretStore needs from a controller-runtime cache
// (cache.Cache has both halves).
type SecretCache interface {
	client.Reader
	client.FieldIndexer
}

// SecretStore is a Store backed by API-key Secrets: a key belongs to the
// namespace of the Secret whose data field "sha256" is the key's digest.
//
// It reads through an informer cache and finds a key's Secret with a field
// index on the digest, so a lookup costs a map access, never a request to the
// API server; a new Secret takes effect, and a deleted one (or one being
// deleted) stops working, as soon as the informer sees the change.
//
// If the same digest appears in Secrets of two namespaces, the key is refused
// (and the Secrets are logged by name) rather than handed to either team.
type SecretStore struct {
	reader client.Reader
}

var _ Store = (*SecretStore)(nil)

// NewSecretStore registers the digest index on c and returns a store reading
// through it. The index can be added before or after c starts, but only once
// per cache. For the informer to hold API-key Secrets only, rather than every
// Secret in the cluster, build the cache with options passed through
// ConfigureCache. Either way, the server needs RBAC to list and watch
// Secrets in every namespace (and to create them, for CreateKey).
func NewSecretStore(ctx context.Context, c SecretCache) (*SecretStore, error) {
	if err := c.IndexField(ctx, &corev1.Secret{}, digestIndex, indexSecretDigest); err != nil {
		return nil, fmt.Errorf("index API-key Secrets by digest: %w", err)
	}
	return &SecretStore{reader: c}, nil
}

// Team implements Store.
func (s *SecretStore) Team(ctx context.Context, key string) (string, error) {
	if !ValidKey(key) {
		return "", ErrUnknownKey
	}
	d := digest(key)
	var list corev1.SecretList
	// The cache's objects are only read here, so they need no copy.
	err := s.reader.List(ctx, &list, client.MatchingFields{digestIndex: hex.EncodeToString(d[:])}, client.UnsafeDisableDeepCopy)
	if err != nil {
		return "", fmt.Errorf("look up API key: %w", err)
	}
	team := ""
	for i := range list.Items {
		sec := &list.Items[i]
		got, ok := secretDigest(sec)
		if !ok || !isKeySecret(sec) || sec.DeletionTimestamp != nil || !equalDigests(got[:], d[:]) {
			continue
		}
		if team != "" && team != sec.Namespace {
			slog.ErrorContext(ctx, "API key digest found in Secrets of more than one namespace; refusing the key",
				"secrets", secretNames(list.Items))
			return "", ErrUnknownKey
		}
		team = sec.Namespace
	}
	if team == "" {
		return "", ErrUnknownKey
	}
	return team, nil
}

// ConfigureCache makes a cache built with opts hold only API-key Secrets, and
// of those only the metadata and the digest, so the server keeps neither the
// cluster's other Secrets nor stray data in memory. Any other reader of
// Secrets through that cache sees the same subset.
func ConfigureCache(opts *cache.Options) {
	if opts.ByObject == nil {
		opts.ByObject = map[client.Object]cache.ByObject{}
	}
	opts.ByObject[&corev1.Secret{}] = cache.ByObject{
		Label:     keySecretSelector(),
		Transform: trimKeySecret,
	}
}

func keySecretSelector() labels.Selector {
	req, err := labels.NewRequirement(LabelAPIKey, selection.Exists, nil)
	if err != nil {
		panic(fmt.Sprintf("auth: label requirement for %s: %v", LabelAPIKey, err)) // a constant; cannot fail
	}
	return labels.NewSelector().Add(*req)
}

// trimKeySecret drops what lookups never read before a Secret enters the
// cache.
func trimKeySecret(obj any) (any, error) {
	sec, ok := obj.(*corev1.Secret)
	if !ok {
		return obj, nil
	}
	sec.ManagedFields = nil
	for k := range sec.Data {
		if k != SecretDigestField {
			delete(sec.Data, k)
		}
	}
	sec.StringData = nil
	return sec, nil
}

// NewKeySecret makes a key for team and the Secret that stores its digest,
// not yet created. CreateKey and CreateKeySecret are NewKeySecret plus
// Create.
func NewKeySecret(team string) (key string, secret *corev1.Secret, err error) {
	if msgs := validation.IsDNS1123Label(team); len(msgs) > 0 {
		return "", nil, fmt.Errorf("team %q is not a namespace name: %s", team, strings.Join(msgs, "; "))
	}
	key, err = NewKey()
	if err != nil {
		return "", nil, err
	}
	immutable := true
	secret = &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    team,
			GenerateName: SecretGenerateName,
			Labels:       map[string]string{LabelAPIKey: "true"},
			Annotations:  map[string]string{AnnotationKeyPrefix: key[:8]},
		},
		Type:      SecretType,
		Immutable: &immutable,
		Data:      map[string][]byte{SecretDigestField: []byte(Hash(key))},
	}
	return key, secret, nil
}

// CreateKey creates a new API key for team (a namespace, which must exist)
// and returns it. This is the only time the key is seen: the cluster stores
// only its digest. The Secret looks like this:
//
//	apiVersion: v1
//	kind: Secret
//	metadata:
//	  namespace: <team>
//	  generateName: e2b-key-          # name: e2b-key-<5 random characters>
//	  labels:
//	    skiff.dev/api-key: "true"     # any value; the label's presence counts
//	  annotations:
//	    skiff.dev/api-key-prefix: e2b_1a2b   # first 8 characters of the key
//	type: skiff.dev/api-key           # not required by lookups
//	immutable: true
//	data:
//	  sha256: <base64 of the key's SHA-256 digest in hex, 64 characters>
//
// By hand: `kubectl -n T create secret generic NAME
// --from-literal=sha256=$(printf %s "$KEY" | sha256sum | cut -d' ' -f1)`,
// then `kubectl -n T label secret NAME skiff.dev/api-key=true`. Deleting the
// Secret (or removing its label) revokes the key.
func CreateKey(ctx context.Context, c client.Writer, team string) (string, error) {
	key, _, err := CreateKeySecret(ctx, c, team)
	return key, err
}

// CreateKeySecret is CreateKey that also returns the Secret as created (its
// generated name included), for a caller that reports where the key lives.
// A team without a namespace is an error for which apierrors.IsNotFound is
// true and that says so.
func CreateKeySecret(ctx context.Context, c client.Writer, team string) (string, *corev1.Secret, error) {
	key, secret, err := NewKeySecret(team)
	if err != nil {
		return "", nil, err
	}
	if err := c.Create(ctx, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return "", nil, fmt.Errorf("create API key Secret: team %q has no namespace (a team is a namespace: create it first): %w", team, err)
		}
		return "", nil, fmt.Errorf("create API key Secret in namespace %s: %w", team, err)
	}
	return key, secret, nil
}

func indexSecretDigest(obj client.Object) []string {
	sec, ok := obj.(*corev1.Secret)
	if !ok || !isKeySecret(sec) {
		return nil
	}
	d, ok := secretDigest(sec)
	if !ok {
		return nil
	}
	return []string{hex.EncodeToString(d[:])}
}

func isKeySecret(sec *corev1.Secret) bool {
	_, ok := sec.Labels[LabelAPIKey]
	return ok
}

// secretDigest reads the digest field, tolerating surrounding blanks and
// upper-case hex from hand-made Secrets.
func secretDigest(sec *corev1.Secret) ([32]byte, bool) {
	return parseHexDigest(strings.TrimSpace(string(sec.Data[SecretDigestField])))
}

func secretNames(items []corev1.Secret) []string {
	out := make([]string, 0, len(items))
	for i := range items {
		out = append(out, items[i].Namespace+"/"+items[i].Name)
	}
	return out
}
