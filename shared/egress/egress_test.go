package egress

import (
	"net/netip"
	"testing"
)

// The cases of e2b's own TestValidateNetworkConfig and its network update
// integration test.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		allow, deny []string
		want        string // the message, "" for valid
	}{
		{nil, nil, ""},
		{[]string{"8.8.8.8"}, nil, ""},
		{[]string{"8.8.0.0/16"}, nil, ""},
		{nil, []string{AllTraffic}, ""},
		{[]string{"8.8.8.8"}, []string{AllTraffic}, ""},
		{[]string{"example.com"}, []string{AllTraffic}, ""},
		{[]string{"*.example.com"}, []string{AllTraffic}, ""},
		{[]string{"example.com", "8.8.8.8"}, []string{AllTraffic, "10.0.0.0/8"}, ""},
		{nil, []string{"10.0.0.0/8", "192.168.0.0/16"}, ""},
		{[]string{}, nil, ""},
		{[]string{"8.8.8.8/24"}, nil, ""}, // host bits set: accepted
		{nil, []string{"example.com"}, "invalid denied CIDR example.com"},
		{nil, []string{"not-a-cidr"}, "invalid denied CIDR not-a-cidr"},
		{nil, []string{AllTraffic, "example.com"}, "invalid denied CIDR example.com"},
		{nil, []string{"ALL_TRAFFIC"}, "invalid denied CIDR ALL_TRAFFIC"},
		{nil, []string{"0.0.0.0"}, "invalid denied CIDR 0.0.0.0"},
		{nil, []string{"0.0.0.0/8"}, "invalid denied CIDR 0.0.0.0/8"},
		{[]string{"0.0.0.0"}, nil, "invalid allowed address 0.0.0.0"},
		{[]string{"google.com"}, nil, ErrMsgDomainsRequireBlockAll},
		{[]string{"*.example.com"}, []string{"10.0.0.0/8"}, ErrMsgDomainsRequireBlockAll},
		{[]string{"example.com", "8.8.8.8"}, []string{"10.0.0.0/8"}, ErrMsgDomainsRequireBlockAll},
	} {
		err := Validate(tc.allow, tc.deny)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("Validate(%q, %q) = %q, want %q", tc.allow, tc.deny, got, tc.want)
		}
	}
}

func TestEffective(t *testing.T) {
	off := false
	r := Effective([]string{"1.1.1.1", "8.8.0.0/16", "Example.COM", "*.api.test."}, []string{"10.0.0.0/8"}, nil)
	if len(r.AllowCIDRs) != 2 || r.AllowCIDRs[0] != netip.MustParsePrefix("1.1.1.1/32") || len(r.AllowDomains) != 2 || r.AllowDomains[0] != "example.com" || r.AllowDomains[1] != "*.api.test" {
		t.Errorf("rules = %+v", r)
	}
	if !r.Restricts() || r.DeniesAll() || !r.HasDomains() {
		t.Errorf("restricts %v, denies all %v, domains %v", r.Restricts(), r.DeniesAll(), r.HasDomains())
	}
	// allow_internet_access false denies all, under the same allowOut.
	r = Effective([]string{"8.8.8.8"}, []string{"1.2.3.4"}, &off)
	if !r.DeniesAll() || !r.AllowsAddr(netip.MustParseAddr("8.8.8.8")) || r.AllowsAddr(netip.MustParseAddr("1.1.1.1")) {
		t.Errorf("internet off: %+v", r)
	}
	if r := Effective([]string{"8.8.8.8"}, nil, nil); r.Restricts() {
		t.Error("allowOut alone restricts")
	}
}

func TestDecisions(t *testing.T) {
	r := Effective([]string{"1.1.1.1", "example.com", "*.wild.test"}, []string{AllTraffic, "1.1.1.1"}, nil)
	for addr, want := range map[string]bool{"1.1.1.1": true, "8.8.8.8": false} {
		if got := r.AllowsAddr(netip.MustParseAddr(addr)); got != want {
			t.Errorf("AllowsAddr(%s) = %v: allow wins over deny, the rest is denied", addr, got)
		}
	}
	for host, want := range map[string]bool{
		"example.com": true, "EXAMPLE.com.": true, "www.example.com": false,
		"a.wild.test": true, "a.b.wild.test": true, "wild.test": false, "evilwild.test": false, "": false,
	} {
		if got := r.AllowsName(host); got != want {
			t.Errorf("AllowsName(%q) = %v, want %v", host, got, want)
		}
	}
	if star := Effective([]string{"*"}, []string{AllTraffic}, nil); !star.AllowsName("anything.example") || star.AllowsName("") {
		t.Error(`"*" must allow every name, and no empty one`)
	}
	d := Effective(nil, []string{"8.8.8.8"}, nil)
	if d.AllowsAddr(netip.MustParseAddr("8.8.8.8")) || !d.AllowsAddr(netip.MustParseAddr("1.1.1.1")) {
		t.Error("a denied address is denied, the rest allowed")
	}
}
