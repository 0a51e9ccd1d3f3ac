package server

import "testing"

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mut     func(*Options)
		wantErr bool
	}{
		{"defaults", func(*Options) {}, false},
		{"port 0 picks one", func(o *Options) { o.Port = 0 }, false},
		{"negative port", func(o *Options) { o.Port = -1 }, true},
		{"port too high", func(o *Options) { o.Port = 65536 }, true},
		{"no address", func(o *Options) { o.ListenAddress = "" }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			tc.mut(&o)
			if err := o.Validate(); (err != nil) != tc.wantErr {
				t.Fatalf("Validate() = %v, wantErr %v", err, tc.wantErr)
			}
		})
	}
}
