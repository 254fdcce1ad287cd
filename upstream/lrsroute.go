package upstream

// ServerOfName is ServerOf for the upstream that serves name of typeURL:
// its xdstp authority's upstream, or the type's for any other name ("" is
// the type's). Load reports of xdstp Clusters thus go to the control plane
// that serves them (docs/load-reports.md).
func ServerOfName(f Feed, typeURL, name string) (Server, bool) {
	if sw, ok := f.(*Switch); ok {
		f = sw.lrsFeed() // load reports go to the fallback path's servers
	}
	if rf, ok := f.(*routedFeed); ok {
		return rf.serverOfRoute(rf.r.routes.Of(typeURL, name), typeURL)
	}
	return ServerOf(f, typeURL)
}
