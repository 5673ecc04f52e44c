package block

import "testing"

// TestParseDir holds the two layout directories to the engine's grammar and
// reads their tier and group.
func TestParseDir(t *testing.T) {
	const tier = "M_0123456789ab_r0"
	none := Dir{Level: NotLayoutDir, Group: -1}
	for rel, want := range map[string]Dir{
		tier + "/abc":                          {Level: PrefixDir, Tier: tier, Group: -1},
		tier + "/abc/de_g0":                    {Level: GroupDir, Tier: tier, Group: 0},
		tier + "/abc/de_g12":                   {Level: GroupDir, Tier: tier, Group: 12},
		tier:                                   none,
		tier + "/ABC":                          none,
		tier + "/abcd":                         none,
		tier + "/config.json":                  none,
		tier + "/abc/de_g":                     none,
		tier + "/abc/de_gx":                    none,
		tier + "/abc/dex_g0":                   none,
		tier + "/abc/de_g0/x.bin":              none,
		tier + "/xyz/de_g0":                    none,
		"/abc":                                 none,
		tier + "/abc/de_g0_tmp":                none,
		tier + "/abc/de_g0/":                   none,
		tier + "/abc/.o_direct_probe_":         none,
		tier + "/abc/de_g99999999999999999999": none,
	} {
		if got := ParseDir(rel); got != want {
			t.Errorf("ParseDir(%q) = %+v, want %+v", rel, got, want)
		}
	}
}
