package xds

// TypeLabels are the type label values of the relay's per-type metric
// families (ShortName of each of Types: Cluster, ClusterLoadAssignment,
// ...), in Types' order: the series a family creates at 0 at startup.
func TypeLabels() []string {
	out := make([]string, len(Types))
	for i, t := range Types {
		out[i] = ShortName(t)
	}
	return out
}
