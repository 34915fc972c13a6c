package rules

// Views in the route graph. A view's virtual name is a topic name only
// the proxy's clients see; it must not be a topic that exists for real
// for the rules: clients of the view would fetch the view where they
// meant the real topic. Across the files of a rules directory the loader
// refuses, in priority order (the first file keeps running):
//
//   - a virtual name equal to a topic a route reads or writes (source,
//     sink, dead letters), or a route whose topics include a view's
//     virtual name;
//   - a view whose topic is another view's virtual name: views read real
//     topics, they do not chain.
//
// Two views of one name (two in-place views of one topic among them) are
// refused by the name check (checkNames, the watcher's claims). A virtual
// name equal to a topic that exists in the cluster but that no rule file
// names is not seen here: the view shadows it for the proxy's clients,
// as docs/RULES.md says.

// checkView returns why the view r cannot join the graph.
func (g *graph) checkView(r *Route) []*Error {
	var errs []*Error
	v := r.View
	if o := g.views[v.Topic]; o != nil {
		errs = append(errs, r.errAt("topic", v.Topic,
			"`topic` `%s` is the virtual name of view `%s` (%s), not a real topic; views read real topics and do not chain. Read `%s` (the topic that view reads) and repeat its steps",
			v.Topic, o.Name, o.where("view"), o.View.Topic))
	}
	if r.InPlace() {
		return errs
	}
	for _, o := range g.routes {
		for _, t := range append(o.outputs(), struct{ key, topic string }{"source.topic", o.Source.Topic}) {
			if t.topic == r.Name {
				errs = append(errs, r.errAt("view", r.Name,
					"view name `%s` is a real topic: route `%s` (%s) uses it as its %s. Clients would fetch the view where they mean the real topic; give the view another name",
					r.Name, o.Name, o.where(t.key), t.key))
			}
		}
	}
	for _, o := range g.routes {
		if internalTopicOf(o.Name, r.Name) {
			errs = append(errs, r.errAt("view", r.Name,
				"view name `%s` is an internal topic of route `%s` (%s; its repartition or changelog topic); give the view another name",
				r.Name, o.Name, o.where("route")))
		}
	}
	if o := g.guards[r.Name]; o != nil {
		errs = append(errs, r.errAt("view", r.Name,
			"view name `%s` is the dead-letter topic guard `%s` (%s) writes; give the view another name",
			r.Name, o.Name, o.File))
	}
	for name, o := range g.views {
		if o.View.Topic == r.Name {
			errs = append(errs, r.errAt("view", r.Name,
				"view name `%s` is the topic view `%s` (%s) reads; a virtual name must not hide a real topic. Give this view another name",
				r.Name, name, o.where("topic")))
		}
	}
	return errs
}

// routeVsViews returns why the route r's topics collide with an accepted
// view's virtual name.
func (g *graph) routeVsViews(r *Route) []*Error {
	var errs []*Error
	for _, t := range append(r.outputs(), struct{ key, topic string }{"source.topic", r.Source.Topic}) {
		if o := g.views[t.topic]; o != nil {
			errs = append(errs, r.errAt(t.key, t.topic,
				"%s `%s` is the virtual name of view `%s` (%s): the proxy's clients fetch that name through the view. Choose another topic, or rename the view",
				t.key, t.topic, o.Name, o.where("view")))
		}
	}
	return errs
}

// guardVsViews returns why the guard r's dead-letter topic collides with
// an accepted view's virtual name.
func (g *graph) guardVsViews(r *Route) []*Error {
	o := g.views[r.Guard.DeadLetter]
	if o == nil {
		return nil
	}
	return []*Error{r.errAt("dead_letter", r.Guard.DeadLetter,
		"dead_letter `%s` is the virtual name of view `%s` (%s): the proxy's clients fetch that name through the view. Choose another dead-letter topic, or rename the view",
		r.Guard.DeadLetter, o.Name, o.where("view"))}
}
