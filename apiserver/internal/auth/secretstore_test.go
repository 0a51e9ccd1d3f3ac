package auth_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/apiserver/internal/auth"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// startCache starts an informer cache built with configure's options, as the
// server builds its own; it stops when the test ends.
func startCache(tb testing.TB, env *kubetest.Env, configure func(*cache.Options)) cache.Cache {
	tb.Helper()
	opts := cache.Options{Scheme: env.Scheme}
	configure(&opts)
	c, err := cache.New(env.Config, opts)
	if err != nil {
		tb.Fatalf("new cache: %v", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Start(ctx); err != nil {
			tb.Errorf("cache: %v", err)
		}
	})
	tb.Cleanup(func() { stop(); wg.Wait() })
	return c
}

func createNamespaces(tb testing.TB, c client.Client, names ...string) {
	tb.Helper()
	for _, name := range names {
		if err := c.Create(tb.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			tb.Fatalf("create namespace %s: %v", name, err)
		}
	}
}

// digestSecret is a hand-made API-key Secret holding key's digest.
func digestSecret(ns, name, key string, labelled bool) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Data:       map[string][]byte{auth.SecretDigestField: []byte(auth.Hash(key))},
	}
	if labelled {
		s.Labels = map[string]string{auth.LabelAPIKey: "true"}
	}
	return s
}

// waitTeam waits until the store maps key to want ("" for ErrUnknownKey); the
// cache follows the API server asynchronously.
func waitTeam(t *testing.T, s auth.Store, key, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		team, err := s.Team(t.Context(), key)
		switch {
		case want == "" && errors.Is(err, auth.ErrUnknownKey):
			return
		case want != "" && err == nil && team == want:
			return
		case err != nil && !errors.Is(err, auth.ErrUnknownKey):
			t.Fatalf("Team: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("Team(key) = %q, %v; want %q within 30s", team, err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func assertUnknown(t *testing.T, s auth.Store, key string) {
	t.Helper()
	if team, err := s.Team(t.Context(), key); !errors.Is(err, auth.ErrUnknownKey) {
		t.Errorf("Team(%q) = %q, %v; want ErrUnknownKey", key, team, err)
	}
}

func TestSecretStore(t *testing.T) {
	env := kubetest.Start(t)
	ctx := t.Context()
	createNamespaces(t, env.Client, "team-a", "team-b", "team-c", "team-d")

	// As in production: a cache holding only API-key Secrets, indexed by
	// digest before it starts.
	c := startCache(t, env, auth.ConfigureCache)
	store, err := auth.NewSecretStore(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}

	keyA, err := auth.CreateKey(ctx, env.Client, "team-a")
	if err != nil {
		t.Fatalf("CreateKey(team-a): %v", err)
	}
	if !auth.ValidKey(keyA) {
		t.Fatalf("CreateKey returned %q, not a valid key", keyA)
	}
	secretA := checkKeySecret(t, env.Client, "team-a", keyA)
	waitTeam(t, store, keyA, "team-a")

	keyB, err := auth.CreateKey(ctx, env.Client, "team-b")
	if err != nil {
		t.Fatalf("CreateKey(team-b): %v", err)
	}
	waitTeam(t, store, keyB, "team-b")
	waitTeam(t, store, keyA, "team-a")

	t.Run("wrong keys", func(t *testing.T) {
		for _, key := range []string{"", "e2b_", "hello", strings.ToUpper(keyA), keyA[:43] + "x",
			"e2b_" + strings.Repeat("0", 40), keyA + " "} {
			assertUnknown(t, store, key)
		}
	})

	t.Run("hand-made Secret", func(t *testing.T) {
		// What an operator writes with kubectl: Opaque, stringData, upper-case
		// hex and a trailing newline, a label with an empty value.
		key, _ := auth.NewKey()
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team-c", Name: "by-hand", Labels: map[string]string{auth.LabelAPIKey: ""}},
			StringData: map[string]string{auth.SecretDigestField: strings.ToUpper(auth.Hash(key)) + "\n", "note": "for CI"},
		}
		if err := env.Client.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		waitTeam(t, store, key, "team-c")
		// The cache keeps the digest and the metadata, nothing else.
		cached := &corev1.Secret{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(s), cached); err != nil {
			t.Fatal(err)
		}
		if _, ok := cached.Data["note"]; ok || len(cached.Data) != 1 || len(cached.ManagedFields) != 0 {
			t.Errorf("cached Secret keeps data %d fields, managedFields %d; want the digest only", len(cached.Data), len(cached.ManagedFields))
		}
	})

	t.Run("unlabelled Secret is not a key", func(t *testing.T) {
		key, _ := auth.NewKey()
		if err := env.Client.Create(ctx, digestSecret("team-c", "unlabelled", key, false)); err != nil {
			t.Fatal(err)
		}
		// Events of one resource arrive in order: once a later key is
		// visible, the unlabelled Secret would have been too.
		later, _ := auth.NewKey()
		if err := env.Client.Create(ctx, digestSecret("team-c", "later", later, true)); err != nil {
			t.Fatal(err)
		}
		waitTeam(t, store, later, "team-c")
		assertUnknown(t, store, key)
		// The label selector keeps it out of the cache altogether.
		err := c.Get(ctx, client.ObjectKey{Namespace: "team-c", Name: "unlabelled"}, &corev1.Secret{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("cache Get(unlabelled) = %v, want NotFound", err)
		}
	})

	t.Run("a digest in two namespaces is refused", func(t *testing.T) {
		// Someone who can read team-a's Secrets copies one into team-d: the
		// key must not start answering for team-d, nor keep answering for
		// team-a until the copy is gone.
		cp := digestSecret("team-d", "copied", keyA, true)
		if err := env.Client.Create(ctx, cp); err != nil {
			t.Fatal(err)
		}
		waitTeam(t, store, keyA, "")
		if err := env.Client.Delete(ctx, cp); err != nil {
			t.Fatal(err)
		}
		waitTeam(t, store, keyA, "team-a")
	})

	t.Run("two Secrets in one namespace", func(t *testing.T) {
		dup := digestSecret("team-b", "second-copy", keyB, true)
		if err := env.Client.Create(ctx, dup); err != nil {
			t.Fatal(err)
		}
		later, _ := auth.NewKey()
		if err := env.Client.Create(ctx, digestSecret("team-b", "later", later, true)); err != nil {
			t.Fatal(err)
		}
		waitTeam(t, store, later, "team-b")
		waitTeam(t, store, keyB, "team-b")
		if err := env.Client.Delete(ctx, dup); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a Secret being deleted no longer counts", func(t *testing.T) {
		key, err := auth.CreateKey(ctx, env.Client, "team-c")
		if err != nil {
			t.Fatal(err)
		}
		waitTeam(t, store, key, "team-c")
		s := findKeySecret(t, env.Client, "team-c", key)
		// A finalizer holds the Secret in "terminating".
		patch := client.MergeFrom(s.DeepCopy())
		s.Finalizers = []string{"skiff.dev/test-hold"}
		if err := env.Client.Patch(ctx, s, patch); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Delete(ctx, s); err != nil {
			t.Fatal(err)
		}
		waitTeam(t, store, key, "")
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
			t.Fatalf("the terminating Secret is gone already: %v", err)
		}
		patch = client.MergeFrom(s.DeepCopy())
		s.Finalizers = nil
		if err := env.Client.Patch(ctx, s, patch); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("removing the label revokes", func(t *testing.T) {
		s := findKeySecret(t, env.Client, "team-b", keyB)
		patch := client.MergeFrom(s.DeepCopy())
		delete(s.Labels, auth.LabelAPIKey)
		if err := env.Client.Patch(ctx, s, patch); err != nil {
			t.Fatal(err)
		}
		waitTeam(t, store, keyB, "")
	})

	t.Run("deleting the Secret revokes", func(t *testing.T) {
		if err := env.Client.Delete(ctx, secretA); err != nil {
			t.Fatal(err)
		}
		waitTeam(t, store, keyA, "")
	})

	t.Run("CreateKey refuses bad teams", func(t *testing.T) {
		for _, team := range []string{"", "Team-A", "team_a", strings.Repeat("a", 64)} {
			if key, err := auth.CreateKey(ctx, env.Client, team); err == nil {
				t.Errorf("CreateKey(%q) = %q, want an error", team, key)
			}
		}
		key, err := auth.CreateKey(ctx, env.Client, "no-such-team")
		if !apierrors.IsNotFound(err) {
			t.Errorf("CreateKey(no-such-team) = %q, %v; want NotFound", key, err)
		}
	})

	t.Run("an unfiltered cache indexed after it started", func(t *testing.T) {
		// A cache shared with other readers, holding every Secret, that
		// already runs when the store is made.
		shared := env.StartCache(t, &corev1.Secret{})
		s2, err := auth.NewSecretStore(ctx, shared)
		if err != nil {
			t.Fatal(err)
		}
		key, err := auth.CreateKey(ctx, env.Client, "team-d")
		if err != nil {
			t.Fatal(err)
		}
		waitTeam(t, s2, key, "team-d")
		unlabelled, _ := auth.NewKey()
		if err := env.Client.Create(ctx, digestSecret("team-d", "unlabelled", unlabelled, false)); err != nil {
			t.Fatal(err)
		}
		later, err := auth.CreateKey(ctx, env.Client, "team-d")
		if err != nil {
			t.Fatal(err)
		}
		waitTeam(t, s2, later, "team-d")
		assertUnknown(t, s2, unlabelled)
		var all corev1.SecretList
		if err := shared.List(ctx, &all, client.InNamespace("team-d")); err != nil {
			t.Fatal(err)
		}
		if len(all.Items) < 3 {
			t.Fatalf("the unfiltered cache holds %d Secrets in team-d, want the unlabelled one too", len(all.Items))
		}
	})
}

// findKeySecret returns the API-key Secret in ns holding key's digest.
func findKeySecret(t *testing.T, c client.Client, ns, key string) *corev1.Secret {
	t.Helper()
	var list corev1.SecretList
	if err := c.List(t.Context(), &list, client.InNamespace(ns), client.HasLabels{auth.LabelAPIKey}); err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		if string(list.Items[i].Data[auth.SecretDigestField]) == auth.Hash(key) {
			return &list.Items[i]
		}
	}
	t.Fatalf("no API-key Secret in %s holds the key's digest", ns)
	return nil
}

// checkKeySecret checks the Secret CreateKey wrote has the documented shape.
func checkKeySecret(t *testing.T, c client.Client, ns, key string) *corev1.Secret {
	t.Helper()
	s := findKeySecret(t, c, ns, key)
	if !strings.HasPrefix(s.Name, auth.SecretGenerateName) || len(s.Name) <= len(auth.SecretGenerateName) {
		t.Errorf("name %q, want %s<suffix>", s.Name, auth.SecretGenerateName)
	}
	if got := s.Labels[auth.LabelAPIKey]; got != "true" {
		t.Errorf("label %s = %q, want true", auth.LabelAPIKey, got)
	}
	if got := s.Annotations[auth.AnnotationKeyPrefix]; got != key[:8] {
		t.Errorf("annotation %s = %q, want %q", auth.AnnotationKeyPrefix, got, key[:8])
	}
	if s.Type != auth.SecretType {
		t.Errorf("type %q, want %q", s.Type, auth.SecretType)
	}
	if s.Immutable == nil || !*s.Immutable {
		t.Error("not immutable")
	}
	if len(s.Data) != 1 {
		t.Errorf("data fields %d, want only %s", len(s.Data), auth.SecretDigestField)
	}
	for k, v := range s.Data {
		if strings.Contains(string(v), key[4:]) {
			t.Errorf("data %s holds the key itself", k)
		}
	}
	return s
}

// Lookups cost a map access whatever the number of keys: compare ns/op of
// the two sizes.
func BenchmarkSecretStoreTeam(b *testing.B) {
	env := kubetest.Start(b)
	createNamespaces(b, env.Client, "bench")
	c := startCache(b, env, auth.ConfigureCache)
	store, err := auth.NewSecretStore(b.Context(), c)
	if err != nil {
		b.Fatal(err)
	}
	var keys []string
	for _, n := range []int{10, 1000} {
		for len(keys) < n {
			key, err := auth.CreateKey(b.Context(), env.Client, "bench")
			if err != nil {
				b.Fatal(err)
			}
			keys = append(keys, key)
		}
		last := keys[len(keys)-1]
		for {
			if team, _ := store.Team(b.Context(), last); team == "bench" {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			i := 0
			for b.Loop() {
				if _, err := store.Team(b.Context(), keys[i%len(keys)]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
