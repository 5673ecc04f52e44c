package mountinfo

import (
	"slices"
	"testing"
)

func TestParseLine(t *testing.T) {
	line := `61 28 0:52 / /mnt/kv\040tier rw,nosuid,nodev,relatime shared:33 - fuse.kvtierfs kvtierfs:/nvme/kv\040store rw,user_id=0,group_id=0,default_permissions`
	m, ok := ParseLine(line)
	want := Mount{ID: 61, Mountpoint: "/mnt/kv tier", Device: "0:52", FSType: "fuse.kvtierfs", Source: "kvtierfs:/nvme/kv store",
		SuperOptions: "rw,user_id=0,group_id=0,default_permissions"}
	if !ok || m != want {
		t.Errorf("ParseLine = %+v, %v; want %+v", m, ok, want)
	}
	if _, ok := ParseLine("61 28 0:52 /"); ok {
		t.Error("a line without a mount point parsed")
	}
	if m, ok := ParseLine(`1 2 3 / /a\\b\0 x`); !ok || m.Mountpoint != `/a\\b\0` || m.FSType != "" {
		t.Errorf("a line without separator or valid escapes: %+v, %v", m, ok)
	}
}

func TestAtAndUnder(t *testing.T) {
	mounts := []Mount{{Mountpoint: "/"}, {Mountpoint: "/w"}, {Mountpoint: "/w/a", FSType: "x"},
		{Mountpoint: "/w/a/b"}, {Mountpoint: "/wx"}, {Mountpoint: "/w/a", FSType: "y"}}
	if at := At(mounts, "/w/a"); len(at) != 2 || at[1].FSType != "y" {
		t.Errorf("At = %+v, want the two mounts at /w/a, the later last", at)
	}
	if got, want := Under(mounts, "/w"), []string{"/w/a", "/w/a/b", "/w/a", "/w"}; !slices.Equal(got, want) {
		t.Errorf("Under = %q, want %q", got, want)
	}
}

// This process's own table has the root mount.
func TestReadSelf(t *testing.T) {
	mounts, err := Read("self")
	if err != nil {
		t.Fatal(err)
	}
	if len(At(mounts, "/")) == 0 {
		t.Errorf("no mount at / among %d", len(mounts))
	}
}

func TestUnescape(t *testing.T) {
	cases := map[string]string{
		`/mnt/kvtier`:                "/mnt/kvtier",
		`/mnt/a\040b`:                "/mnt/a b",
		`/mnt/tab\011x`:              "/mnt/tab\tx",
		`/mnt/nl\012`:                "/mnt/nl\n",
		`/mnt/back\134slash`:         `/mnt/back\slash`,
		`/mnt/trailing\`:             `/mnt/trailing\`,
		`/mnt/short\04`:              `/mnt/short\04`,
		`/mnt/not\999octal`:          `/mnt/not\999octal`,
		`\040\040`:                   "  ",
		`/mnt/utf8\303\251t\303\251`: "/mnt/utf8été",
	}
	for in, want := range cases {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
