package staging

import (
	"bufio"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
)

// Staging budget defaults (the --staging-bytes flag).
const (
	// MaxDefaultBudget caps DefaultBudget: 4 GiB.
	MaxDefaultBudget = 4 << 30
	// FallbackBudget is DefaultBudget when /proc/meminfo cannot be read: 256 MiB.
	FallbackBudget = 256 << 20
)

// DefaultBudget is the default staging budget: 10% of the machine's RAM
// (MemTotal in /proc/meminfo), capped at MaxDefaultBudget, or FallbackBudget
// when the memory size is unknown.
func DefaultBudget() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return FallbackBudget
	}
	defer f.Close()
	total, err := memTotal(f)
	if err != nil {
		return FallbackBudget
	}
	return min(total/10, MaxDefaultBudget)
}

// memTotal returns MemTotal in bytes from the text of /proc/meminfo.
func memTotal(meminfo io.Reader) (int64, error) {
	scanner := bufio.NewScanner(meminfo)
	for scanner.Scan() {
		rest, ok := strings.CutPrefix(scanner.Text(), "MemTotal:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, errors.New("meminfo: MemTotal is not in kB: " + strings.TrimSpace(rest))
		}
		kib, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil || kib <= 0 {
			return 0, errors.New("meminfo: bad MemTotal " + fields[0])
		}
		return kib << 10, nil
	}
	if err := scanner.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("meminfo: no MemTotal line")
}
