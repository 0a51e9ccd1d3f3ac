package hostwatch

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFanoutSignalsEverySubscriber(t *testing.T) {
	src := make(chan struct{})
	f := NewFanout(src)
	a, b := f.Subscribe(), f.Subscribe()
	// Each starts with one signal: read the current state.
	for _, ch := range []<-chan struct{}{a, b} {
		select {
		case <-ch:
		default:
			t.Fatal("a new subscriber got no first signal")
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { f.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	// Three changes while nobody reads coalesce into one signal each.
	for range 3 {
		src <- struct{}{}
	}
	for name, ch := range map[string]<-chan struct{}{"a": a, "b": b} {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("subscriber %s was not signalled", name)
		}
		select {
		case <-ch:
			t.Errorf("subscriber %s got more than one signal for changes it had not read", name)
		default:
		}
	}
}
