package launcher

import "testing"

func TestRouteSource(t *testing.T) {
	for ip, want := range map[string]string{"127.0.0.1": "127.0.0.1/32", "::ffff:127.0.0.1": "127.0.0.1/32"} {
		got, err := RouteSource(ip)
		if err != nil || got.String() != want {
			t.Errorf("RouteSource(%s) = %v, %v; want %s", ip, got, err, want)
		}
	}
	if _, err := RouteSource("not-an-ip"); err == nil {
		t.Error("RouteSource(not-an-ip): want an error")
	}
}
