package deadline

import (
	"slices"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

type fired struct {
	mu  sync.Mutex
	ids []string
	ch  chan string
}

func (f *fired) expire(id string) {
	f.mu.Lock()
	f.ids = append(f.ids, id)
	f.mu.Unlock()
	f.ch <- id
}

func (f *fired) wait(t *testing.T, want ...string) {
	t.Helper()
	var got []string
	for range want {
		select {
		case id := <-f.ch:
			got = append(got, id)
		case <-time.After(5 * time.Second):
			t.Fatalf("fired %v, want %v", got, want)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("fired %v, want %v", got, want)
	}
}

func (f *fired) none(t *testing.T) {
	t.Helper()
	select {
	case id := <-f.ch:
		t.Fatalf("%s fired, want nothing", id)
	case <-time.After(50 * time.Millisecond):
	}
}

var start = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestDeadlines(t *testing.T) {
	c := clocktesting.NewFakeClock(start)
	f := &fired{ch: make(chan string, 10)}
	s := New(c, f.expire)
	defer s.Stop()

	s.Set("a", start.Add(time.Minute))
	s.Set("b", start.Add(2*time.Minute))
	s.Set("c", start.Add(3*time.Minute))
	s.Set("gone", start.Add(time.Minute))
	s.Cancel("gone")
	s.Cancel("never-set")
	s.Set("c", start.Add(10*time.Minute)) // SetTimeout: re-armed later
	if at, ok := s.Deadline("c"); !ok || !at.Equal(start.Add(10*time.Minute)) {
		t.Fatalf("Deadline(c) = %v, %v", at, ok)
	}

	c.Step(59 * time.Second)
	f.none(t)
	c.Step(time.Second)
	f.wait(t, "a")
	c.Step(2 * time.Minute)
	f.wait(t, "b")
	f.none(t) // c moved to 10 minutes
	if _, ok := s.Deadline("a"); ok {
		t.Fatal("a fired but is still armed")
	}
	c.Step(7 * time.Minute)
	f.wait(t, "c")

	// A deadline that passed while sandboxd was down fires at once.
	s.Set("late", start.Add(-time.Hour))
	f.wait(t, "late")
}

func TestStop(t *testing.T) {
	c := clocktesting.NewFakeClock(start)
	f := &fired{ch: make(chan string, 10)}
	s := New(c, f.expire)
	s.Set("a", start.Add(time.Minute))
	s.Stop()
	c.Step(time.Hour)
	f.none(t)
	s.Set("b", start) // after Stop: ignored
	f.none(t)
}

// Re-arming from many goroutines, while past deadlines fire, leaves exactly
// the last deadline of each id armed: it fires once, and no stale one fires
// after it.
func TestConcurrentRearm(t *testing.T) {
	c := clocktesting.NewFakeClock(start)
	f := &fired{ch: make(chan string, 10000)}
	s := New(c, f.expire)
	defer s.Stop()
	var wg sync.WaitGroup
	for i := range 52 {
		wg.Go(func() {
			id := string(rune('a' + i%26))
			for j := range 20 {
				s.Set(id, start.Add(time.Duration(j%3-1)*time.Second)) // some already past
			}
			s.Set(id, start.Add(time.Hour))
		})
	}
	wg.Wait()
	time.Sleep(100 * time.Millisecond) // let past deadlines that won a race fire
	for len(f.ch) > 0 {
		<-f.ch
	}
	for id := range 26 {
		if _, ok := s.Deadline(string(rune('a' + id))); !ok {
			t.Fatalf("%c is not armed after its last Set", 'a'+id)
		}
	}
	c.Step(time.Hour)
	want := make([]string, 26)
	for i := range want {
		want[i] = string(rune('a' + i))
	}
	f.wait(t, want...)
	f.none(t)
}
