package verbs

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/ibvbridge/ibvbridge/internal/netif"
)

// DeviceForNetdev returns the RDMA device and 1-based port behind network
// interface netdev, read from sysfs. The error for a plain NIC matches
// ErrNoRDMADevice.
func DeviceForNetdev(netdev string) (ibdev string, port int, err error) {
	return deviceForNetdev("/sys", netdev)
}

// DeviceForAddr returns the network interface that has the IPv4 address ip
// (which is how spead2, and ibvbridge, are told where to receive and send)
// and the RDMA device and port behind it (DeviceForNetdev). The error wraps
// netif.ErrNoInterface when no interface has ip.
func DeviceForAddr(ip netip.Addr) (netdev, ibdev string, port int, err error) {
	if !ip.Is4() {
		return "", "", 0, fmt.Errorf("interface address %s is not an IPv4 address", ip)
	}
	ifi, err := netif.ByAddr(ip)
	if err != nil {
		return "", "", 0, err
	}
	netdev = ifi.Name
	ibdev, port, err = DeviceForNetdev(netdev)
	if err != nil {
		if nd := (*NoDeviceError)(nil); errors.As(err, &nd) {
			nd.Addr = ip
		}
		return netdev, "", 0, err
	}
	return netdev, ibdev, port, nil
}

// deviceForNetdev does the sysfs walk under root (a fake tree in tests):
//
//  1. /sys/class/net/<netdev>/device/infiniband/<ibdev> names the RDMA device
//     of the PCI function; the port is dev_port+1 (dev_port is the 0-based
//     port of the function; older kernels only have dev_id, in hex).
//  2. Failing that (bonds, representors, software devices), each
//     /sys/class/infiniband/<ibdev>/ports/<n>/gid_attrs/ndevs/<i> names the
//     netdev a RoCE GID belongs to.
func deviceForNetdev(root, netdev string) (string, int, error) {
	if netdev == "" || strings.ContainsRune(netdev, '/') || netdev == "." || netdev == ".." {
		return "", 0, fmt.Errorf("invalid interface name %q", netdev)
	}
	netDir := filepath.Join(root, "class/net", netdev)
	if _, err := os.Stat(netDir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", 0, fmt.Errorf("interface %s not found in %s", netdev, filepath.Join(root, "class/net"))
		}
		return "", 0, fmt.Errorf("interface %s: %w", netdev, err)
	}

	ents, err := os.ReadDir(filepath.Join(netDir, "device/infiniband"))
	if err == nil && len(ents) > 0 {
		names := make([]string, 0, len(ents))
		for _, e := range ents {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		port, err := netdevPort(netDir)
		if err != nil {
			return "", 0, fmt.Errorf("interface %s: %w", netdev, err)
		}
		return names[0], port, nil
	}

	if ibdev, port, ok := scanGIDNdevs(root, netdev); ok {
		return ibdev, port, nil
	}
	return "", 0, &NoDeviceError{Netdev: netdev}
}

// netdevPort turns dev_port (decimal, 0-based) into the 1-based verbs port
// number; kernels before 3.15 lack dev_port and put the port in dev_id (hex).
// Neither file present means a single-port function: port 1.
func netdevPort(netDir string) (int, error) {
	if b, err := os.ReadFile(filepath.Join(netDir, "dev_port")); err == nil {
		s := strings.TrimSpace(string(b))
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("dev_port %q is not a port number", s)
		}
		return n + 1, nil
	}
	if b, err := os.ReadFile(filepath.Join(netDir, "dev_id")); err == nil {
		s := strings.TrimSpace(string(b))
		n, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 16)
		if err != nil {
			return 0, fmt.Errorf("dev_id %q is not a port number", s)
		}
		return int(n) + 1, nil
	}
	return 1, nil
}

func scanGIDNdevs(root, netdev string) (string, int, bool) {
	matches, _ := filepath.Glob(filepath.Join(root, "class/infiniband/*/ports/*/gid_attrs/ndevs/*"))
	sort.Strings(matches)
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil || strings.TrimSpace(string(b)) != netdev {
			continue
		}
		rel, err := filepath.Rel(filepath.Join(root, "class/infiniband"), m)
		if err != nil {
			continue
		}
		parts := strings.Split(rel, string(filepath.Separator))
		if len(parts) < 3 {
			continue
		}
		port, err := strconv.Atoi(parts[2])
		if err != nil || port < 1 {
			continue
		}
		return parts[0], port, true
	}
	return "", 0, false
}
