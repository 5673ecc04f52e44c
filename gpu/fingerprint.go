package gpu

import "encoding/binary"

// FingerprintName names the fingerprint definition below; it changes if the
// definition ever does, so ranks never compare fingerprints of different kinds.
const FingerprintName = "kvtier-fp1"

// fpGamma is the 64-bit golden-ratio increment of SplitMix64.
const fpGamma = 0x9E3779B97F4A7C15

// mix64 is the SplitMix64 finalizer, a bijection on uint64.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// FingerprintHost returns the kvtier-fp1 fingerprint of p, the value every
// backend's Fingerprint returns for device memory holding the same bytes.
//
// Definition, for n = len(p) bytes: split p into words w_0 … w_{m-1},
// m = ceil(n/8), each read little-endian, the last one zero-padded; then
//
//	S  = Σ_i mix64(w_i + (i+1)·γ)        (mod 2^64)
//	FP = mix64(S XOR mix64(n + γ))
//
// where γ = 0x9E3779B97F4A7C15 and mix64 is the SplitMix64 finalizer. Each term
// depends on one word and its index, so any thread may compute any term and the
// sum of per-thread partials is the same in every order (addition mod 2^64 is
// associative and commutative): the device kernel and this loop agree bit for
// bit. The index makes it order-sensitive (swapped words or rows change it), n
// makes trailing zero bytes count. It detects wrong or stale bytes; it is not a
// cryptographic hash.
func FingerprintHost(p []byte) uint64 {
	return fingerprintFinish(fingerprintSum(p, 0), len(p))
}

// fingerprintSum returns the part of S contributed by p, whose first word has
// index firstWord in the fingerprinted range; len(p) must be a multiple of 8
// unless p ends the range.
func fingerprintSum(p []byte, firstWord uint64) uint64 {
	var sum uint64
	index := firstWord
	for len(p) >= 8 {
		index++
		sum += mix64(binary.LittleEndian.Uint64(p) + index*fpGamma)
		p = p[8:]
	}
	if len(p) > 0 {
		var tail [8]byte
		copy(tail[:], p)
		index++
		sum += mix64(binary.LittleEndian.Uint64(tail[:]) + index*fpGamma)
	}
	return sum
}

// fingerprintFinish turns the word sum S of an n-byte range into FP.
func fingerprintFinish(sum uint64, n int) uint64 {
	return mix64(sum ^ mix64(uint64(n)+fpGamma))
}
