package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/rtproxy/rtproxy/internal/benchkit"
	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/pipeline"
	"github.com/rtproxy/rtproxy/protocol"
	"github.com/rtproxy/rtproxy/rules"
)

const viewSalt = "views-test-salt-0123456789"

// loadViews loads the view files of a new rules directory.
func loadViews(t *testing.T, files map[string]string) []*rules.Route {
	t.Helper()
	dir := t.TempDir()
	files["salt"] = viewSalt + "\n"
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rs, errs := rules.LoadDir(dir)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return rs
}

// fakeViewProxy records what the views adapter puts in force.
type fakeViewProxy struct{ set []protocol.Views }

func (f *fakeViewProxy) SetViews(v protocol.Views) { f.set = append(f.set, v) }

const analyticsView = `view: payments.for-analytics
topic: payments
hash_salt_file: salt
steps:
  - filter: value.status != "test"
  - set:
      card: mask(value.card, 4)
      email: hash(value.email)
`

const inPlaceView = `view: payments
topic: payments
clients:
  client_id: ["bi-*"]
  principal: ["User:auditor"]
  tls_subject: ["CN=reports,*"]
steps:
  - drop: [card, email]
`

func TestViewsAdapter(t *testing.T) {
	px := &fakeViewProxy{}
	vw, err := newViews(slog.New(slog.DiscardHandler), viewsSetter(px))
	if err != nil {
		t.Fatal(err)
	}
	vw.apply(loadViews(t, map[string]string{"a.yaml": analyticsView, "b.yaml": inPlaceView}))
	if len(px.set) != 1 || px.set[0] == nil {
		t.Fatalf("SetViews calls %v", px.set)
	}
	vs := px.set[0]

	// Who sees what.
	anyone := protocol.ViewClient{ClientID: "payments-service"}
	bi := protocol.ViewClient{ClientID: "bi-dashboards"}
	auditor := protocol.ViewClient{ClientID: "x", Principal: "User:auditor"}
	reports := protocol.ViewClient{TLSSubject: "CN=reports,O=Acme"}
	if got := vs.Virtual(anyone); len(got) != 1 || got["payments.for-analytics"] != "payments" {
		t.Fatalf("Virtual = %v", got)
	}
	if v := vs.Lookup("payments", anyone); v != nil {
		t.Fatal("a client the in-place view does not name gets it")
	}
	for _, c := range []protocol.ViewClient{bi, auditor, reports} {
		if v := vs.Lookup("payments", c); v == nil || v.Name() != "payments" || v.Topic() != "payments" {
			t.Fatalf("%+v: in-place view %v", c, v)
		}
	}
	if vs.Lookup("orders", bi) != nil {
		t.Fatal("a view for a topic no view names")
	}

	// Apply: a masked record, a filtered one, one that does not decode.
	v := vs.Lookup("payments.for-analytics", anyone)
	stored := []byte(`{"status":"ok","card":"4111111111111111","email":"ann@example.com"}`)
	orig := append([]byte(nil), stored...)
	rec := &protocol.ViewRecord{Partition: 2, Offset: 10, Value: stored, Headers: []kmsg.Header{{Key: "h", Value: []byte("v")}}}
	keep, err := v.Apply(rec)
	if !keep || err != nil {
		t.Fatalf("keep %v err %v", keep, err)
	}
	var got map[string]any
	if err := json.Unmarshal(rec.Value, &got); err != nil {
		t.Fatal(err)
	}
	if got["card"] != "************1111" || got["email"] != operators.HashString([]byte(viewSalt), "ann@example.com") || got["status"] != "ok" {
		t.Fatalf("served %s", rec.Value)
	}
	if string(stored) != string(orig) {
		t.Fatal("Apply changed the fetched batch's bytes in place")
	}
	if keep, err := v.Apply(&protocol.ViewRecord{Value: []byte(`{"status":"test"}`)}); keep || err != nil {
		t.Fatalf("a test record: keep %v err %v", keep, err)
	}
	if keep, err := v.Apply(&protocol.ViewRecord{Value: []byte(`not json`)}); keep || err == nil {
		t.Fatalf("not JSON: keep %v err %v", keep, err)
	}
	w := vs.Lookup("payments", bi)
	rec = &protocol.ViewRecord{Value: stored}
	if keep, err := w.Apply(rec); !keep || err != nil || strings.Contains(string(rec.Value), "4111") || strings.Contains(string(rec.Value), "ann@") {
		t.Fatalf("in place: %s %v %v", rec.Value, keep, err)
	}

	// Counted in Status (/routes, the status page).
	st := vw.Status()
	if len(st) != 2 || st[0].Name != "payments" || !st[0].InPlace || st[0].Records != 1 ||
		st[1].Name != "payments.for-analytics" || st[1].Records != 3 || st[1].Filtered != 1 || st[1].Errors != 1 || st[1].Clients != "every client" {
		t.Fatalf("status %+v", st)
	}
	if st[0].Clients != "client_id bi-*; principal User:auditor; tls_subject CN=reports,*" {
		t.Errorf("clients %q", st[0].Clients)
	}

	// A reload keeps the counts of a view that stays; no views: SetViews(nil).
	vw.apply(loadViews(t, map[string]string{"a.yaml": analyticsView}))
	if st := vw.Status(); len(st) != 1 || st[0].Records != 3 {
		t.Fatalf("after reload %+v", st)
	}
	vw.apply(nil)
	if len(px.set) != 3 || px.set[2] != nil {
		t.Fatalf("no views: SetViews(%v), want nil", px.set[len(px.set)-1])
	}
}

// TestViewsAdapterWithoutFetchPath: a proxy without SetViews still loads
// views (nothing applies them), and says so.
func TestViewsAdapterWithoutFetchPath(t *testing.T) {
	if viewsSetter(struct{}{}) != nil {
		t.Fatal("a setter for a proxy without SetViews")
	}
	vw, err := newViews(slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	vw.apply(loadViews(t, map[string]string{"a.yaml": analyticsView}))
	if len(vw.Status()) != 1 {
		t.Fatal("views not listed")
	}
}

// TestRoutesAndStatusPageListViews: /routes lists views after the routes,
// each with kind "view" and its counts; the status page has a Views table.
func TestRoutesAndStatusPageListViews(t *testing.T) {
	reg := newRegistry()
	vw, err := newViews(slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	vw.apply(loadViews(t, map[string]string{"a.yaml": analyticsView, "b.yaml": inPlaceView}))
	vs := &viewSet{byName: map[string]*viewOf{}}
	for _, o := range vw.cur.Load().all {
		vs.byName[o.route.Name] = o
	}
	vs.byName["payments.for-analytics"].Apply(&protocol.ViewRecord{Value: []byte(`{"status":"test"}`)})

	a, err := newAdmin("127.0.0.1:0", reg, slog.New(slog.DiscardHandler), false)
	if err != nil {
		t.Fatal(err)
	}
	go a.serve()
	defer a.srv.Close()
	a.setReady(func() (bool, string) { return true, "" })
	a.setRoutes(func() any { return []pipeline.RouteStatus{{Name: "r1", State: "running"}} })
	a.setViews(vw.Status)
	get := func(path string) string {
		resp, err := http.Get("http://" + a.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	var list []map[string]any
	if err := json.Unmarshal([]byte(get("/routes")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 || list[0]["name"] != "r1" || list[1]["kind"] != "view" || list[1]["name"] != "payments" || list[1]["in_place"] != true ||
		list[2]["name"] != "payments.for-analytics" || list[2]["records"] != 1.0 || list[2]["filtered"] != 1.0 || list[2]["errors"] != 0.0 {
		t.Fatalf("/routes = %v", list)
	}
	page := get("/")
	for _, want := range []string{"<h2>Views</h2>", "<td>payments.for-analytics</td>", "<td>payments (in place)</td>", "client_id bi-*; principal User:auditor"} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
}

// TestViewsClosedNotReady: a view standing in closed (its file does not
// load) makes the proxy not ready, as a closed guard does, and every record
// it serves is an error.
func TestViewsClosedNotReady(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "v.yaml"), []byte("view: payments\ntopic: payments\nsteps: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	applied := make(chan []*rules.Route, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := rules.WatchWith(ctx, dir, rules.Options{}, slog.New(slog.DiscardHandler), newRegistry(), func(rs []*rules.Route, _ []error) { applied <- rs })
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	rs := <-applied
	vw, err := newViews(slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	if vw.notReady() != "" {
		t.Fatal("not ready before any view")
	}
	vw.apply(rs)
	if why := vw.notReady(); !strings.Contains(why, "view payments does not load") {
		t.Fatalf("notReady = %q", why)
	}
	st := vw.Status()
	if len(st) != 1 || st[0].State != "closed" || st[0].Clients != "every client" {
		t.Fatalf("status %+v", st)
	}
	o := vw.cur.Load().byName["payments"]
	if keep, err := o.Apply(&protocol.ViewRecord{Value: []byte(`{"card":"4111"}`)}); keep || err == nil {
		t.Fatalf("a closed view served a record: %v %v", keep, err)
	}
}

// BenchmarkViewApply: the adapter on the 1 KiB payment through the issue's
// view shape (a filter and one masked field), as the fetch path calls it.
func BenchmarkViewApply(b *testing.B) {
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "v.yaml"), []byte("view: payments.v\ntopic: payments\nsteps:\n  - filter: value.status != \"test\"\n  - set:\n      user_id: mask(value.user_id, 2)\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	rs, errs := rules.LoadDir(dir)
	if len(errs) > 0 {
		b.Fatal(errs)
	}
	vw, err := newViews(slog.New(slog.DiscardHandler), nil)
	if err != nil {
		b.Fatal(err)
	}
	vw.apply(rs)
	v := vw.cur.Load().byName["payments.v"]
	value := benchkit.Payment(1)
	hs := []kmsg.Header{{Key: "trace", Value: []byte("abc")}}
	b.SetBytes(int64(len(value)))
	b.ReportAllocs()
	var scratch []byte // the fetch path's buffer for new values, reused from record to record
	for i := 0; i < b.N; i++ {
		rec := protocol.ViewRecord{Partition: 1, Offset: int64(i), Key: []byte("k"), Value: value, Headers: hs, Timestamp: 1700000000000, Scratch: scratch}
		if keep, err := v.Apply(&rec); !keep || err != nil {
			b.Fatal(keep, err)
		}
		scratch = rec.Scratch
	}
}

// TestViewErrorHeaderOneName: `rtproxy test` (rules.ViewErrorHeader) and
// the fetch path (protocol.ViewErrorHeader) name the placeholder's header
// alike, so a view test file expects what clients get.
func TestViewErrorHeaderOneName(t *testing.T) {
	if rules.ViewErrorHeader != protocol.ViewErrorHeader {
		t.Fatalf("rtproxy test writes %q, the fetch path %q", rules.ViewErrorHeader, protocol.ViewErrorHeader)
	}
}
