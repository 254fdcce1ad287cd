package main

import "unicode/utf8"

// nearestEnv is the environment variable of a key nearest to name, a
// variable that names no key: "" when none is within a few edits.
func nearestEnv(name string) string {
	best, bestD := "", max(3, utf8.RuneCountInString(name)/5)+1
	for _, s := range settings(new(Options)) {
		if d := editDistance(name, envName(s.key)); d < bestD {
			best, bestD = envName(s.key), d
		}
	}
	return best
}

// nearestKey is the key nearest to name, a dotted name that is no key: ""
// when none is within a few edits.
func nearestKey(name string) string {
	best, bestD := "", max(3, utf8.RuneCountInString(name)/5)+1
	for _, s := range settings(new(Options)) {
		if d := editDistance(name, s.key); d < bestD {
			best, bestD = s.key, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, by byte.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// plural is one when n is 1, else many.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
