package verbs

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ibvbridge/ibvbridge/internal/netif"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeSysfs builds the parts of /sys the mapping reads:
//
//	enp1s0f0: mlx5, own PCI function, dev_port 0          -> mlx5_0 port 1
//	enp2s0d1: mlx4 second port, dev_port 1                 -> mlx4_0 port 2
//	eth9:     old kernel, dev_id only, 0x1                 -> mlx4_1 port 2
//	bond0:    no device dir, found via RoCE gid ndevs      -> mlx5_bond_0 port 1
//	eth0:     plain NIC
func fakeSysfs(t *testing.T) string {
	root := t.TempDir()
	net := filepath.Join(root, "class/net")
	writeFile(t, filepath.Join(net, "enp1s0f0/dev_port"), "0\n")
	writeFile(t, filepath.Join(net, "enp1s0f0/device/infiniband/mlx5_0/node_type"), "1: CA\n")
	writeFile(t, filepath.Join(net, "enp2s0d1/dev_port"), "1\n")
	writeFile(t, filepath.Join(net, "enp2s0d1/device/infiniband/mlx4_0/node_type"), "1: CA\n")
	writeFile(t, filepath.Join(net, "eth9/dev_id"), "0x1\n")
	writeFile(t, filepath.Join(net, "eth9/device/infiniband/mlx4_1/node_type"), "1: CA\n")
	writeFile(t, filepath.Join(net, "bond0/type"), "1\n")
	writeFile(t, filepath.Join(root, "class/infiniband/mlx5_bond_0/ports/1/gid_attrs/ndevs/0"), "bond0\n")
	writeFile(t, filepath.Join(root, "class/infiniband/mlx5_bond_0/ports/1/gid_attrs/ndevs/1"), "bond0\n")
	writeFile(t, filepath.Join(net, "eth0/dev_port"), "0\n")
	writeFile(t, filepath.Join(net, "eth0/device/vendor"), "0x8086\n")
	writeFile(t, filepath.Join(net, "bad/dev_port"), "x\n")
	writeFile(t, filepath.Join(net, "bad/device/infiniband/mlx5_9/node_type"), "1: CA\n")
	return root
}

func TestDeviceForNetdev(t *testing.T) {
	root := fakeSysfs(t)
	for _, tc := range []struct {
		netdev, ibdev string
		port          int
	}{
		{"enp1s0f0", "mlx5_0", 1},
		{"enp2s0d1", "mlx4_0", 2},
		{"eth9", "mlx4_1", 2},
		{"bond0", "mlx5_bond_0", 1},
	} {
		ibdev, port, err := deviceForNetdev(root, tc.netdev)
		if err != nil || ibdev != tc.ibdev || port != tc.port {
			t.Errorf("%s: got %s/%d/%v, want %s/%d", tc.netdev, ibdev, port, err, tc.ibdev, tc.port)
		}
	}
}

func TestDeviceForNetdevErrors(t *testing.T) {
	root := fakeSysfs(t)
	_, _, err := deviceForNetdev(root, "eth0")
	if !errors.Is(err, ErrNoRDMADevice) || err.Error() != "interface eth0 has no RDMA device" {
		t.Fatalf("eth0: %v", err)
	}
	nd := &NoDeviceError{Netdev: "eth0", Addr: netip.MustParseAddr("1.2.3.4")}
	if nd.Error() != "interface eth0 (1.2.3.4) has no RDMA device" || !errors.Is(nd, ErrNoRDMADevice) {
		t.Fatalf("%v", nd)
	}
	if _, _, err := deviceForNetdev(root, "nope0"); err == nil || !strings.Contains(err.Error(), "interface nope0 not found") {
		t.Fatalf("nope0: %v", err)
	}
	if _, _, err := deviceForNetdev(root, "bad"); err == nil || !strings.Contains(err.Error(), `dev_port "x"`) {
		t.Fatalf("bad: %v", err)
	}
	if _, _, err := deviceForNetdev(root, "../x"); err == nil || !strings.Contains(err.Error(), "invalid interface name") {
		t.Fatalf("../x: %v", err)
	}
}

// TestDeviceForAddrRejects: only IPv4 addresses, and a missing interface is
// netif's error.
func TestDeviceForAddrRejects(t *testing.T) {
	_, _, _, err := DeviceForAddr(netip.MustParseAddr("::1"))
	if err == nil || err.Error() != "interface address ::1 is not an IPv4 address" {
		t.Fatalf("got %v", err)
	}
	_, _, _, err = DeviceForAddr(netip.MustParseAddr("192.0.2.123"))
	if !errors.Is(err, netif.ErrNoInterface) {
		t.Fatalf("got %v, want netif.ErrNoInterface", err)
	}
}

// On this host loopback has no RDMA device: DeviceForAddr must say which
// interface and address.
func TestDeviceForAddrLoopback(t *testing.T) {
	if _, err := os.Stat("/sys/class/net/lo"); err != nil {
		t.Skip("no sysfs")
	}
	netdev, _, _, err := DeviceForAddr(netip.MustParseAddr("127.0.0.1"))
	if err == nil {
		t.Skip("loopback has an RDMA device (rxe/siw on lo?)")
	}
	want := "interface " + netdev + " (127.0.0.1) has no RDMA device"
	if !errors.Is(err, ErrNoRDMADevice) || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}
