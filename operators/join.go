package operators

import "fmt"

// Missing says what a join does when the table has no row for the key.
type Missing int

const (
	// MissingKeep passes the record on with its `as` name bound to nil,
	// so `merchant?.x ?? default` picks the default.
	MissingKeep Missing = iota
	// MissingDrop drops the record (counted as dropped, not a dead letter).
	MissingDrop
	// MissingDeadLetter sends the record to the dead-letter output with
	// ReasonMissing.
	MissingDeadLetter
)

// String is the rule-file spelling of m.
func (m Missing) String() string {
	switch m {
	case MissingKeep:
		return "keep"
	case MissingDrop:
		return "drop"
	case MissingDeadLetter:
		return "dead_letter"
	}
	return fmt.Sprintf("Missing(%d)", int(m))
}

func init() {
	register(&Spec{
		Kind:    "join",
		Order:   30,
		Summary: "Looks a key up in a table and binds the row under a name for the steps after it (a broadcast join: every proxy holds the whole table).",
		Keys: []Key{
			{Name: "table", Type: TypeTable, Required: true, Doc: "The table, by its name under `tables:`.",
				Needs: "the name of a table under `tables:`"},
			{Name: "on", Type: TypeExpr, Required: true,
				Doc:   "The key looked up: strings as they are, numbers without a trailing `.0`; null matches nothing.",
				Needs: "the expression whose value is looked up in the table, e.g. `on: value.merchant_id`"},
			{Name: "as", Type: TypeName, DefaultFrom: "table",
				Doc: "The name the row is bound under. It must not hide a built-in name, an expr-lang function or an earlier step's name."},
			{Name: "missing", Type: TypeEnum, Default: "keep", Choices: []string{"keep", "drop", "dead_letter"},
				Doc: "When no row matches: `keep` (the name is nil), `drop`, or `dead_letter` (reason `missing`)."},
		},
		Usage: "`join: { table: merchants, on: value.merchant_id, as: merchant }`",
		Example: `route: orders-with-customer
source: { topic: orders }
sink: { topic: orders.with-customer }
tables:
  customers: { topic: customers }
steps:
  - join: { table: customers, on: key, as: customer, missing: drop }
  - set: { customer_name: customer.name }
`,
		Compile: func(a *Args) (*Plan, error) {
			table, on, as := a.String("table"), a.Expr("on"), a.String("as")
			missing := map[string]Missing{"keep": MissingKeep, "drop": MissingDrop, "dead_letter": MissingDeadLetter}[a.String("missing")]
			return &Plan{
				New: func(env BuildEnv) (Step, error) {
					tb := env.Tables[table]
					if tb == nil {
						return nil, fmt.Errorf("table %q is not available", table)
					}
					return NewJoin(tb, on, as, missing), nil
				},
				Binds: as,
				Table: table,
			}, nil
		},
	})
}

// join is a broadcast join: every record looks its key up in a table that
// each task sees whole. The row is bound under `as` in Record.Bound and
// never merged into the value, so a later map decides what to keep.
type join struct {
	table   Table
	on      *Expr
	as      string
	missing Missing
}

// NewJoin returns the `join:` step. on is evaluated on each record and
// turned into a key like every key expression (strings as they are,
// numbers without a trailing ".0"); a null key never matches.
func NewJoin(table Table, on *Expr, as string, missing Missing) Step {
	return &join{table: table, on: on, as: as, missing: missing}
}

func (j *join) Kind() string { return "join" }

func (j *join) Process(r *Record, out Emitter) {
	defer recoverTo("join", r, out)
	v, err := j.on.Eval(r)
	if err != nil {
		out.DeadLetter(r, evalReason(err), fmt.Errorf("join %s: %w", j.as, err))
		return
	}
	var (
		row   map[string]any
		found bool
		key   string
	)
	if v != nil {
		key, err = keyString(v)
		if err != nil {
			out.DeadLetter(r, ReasonError, fmt.Errorf("join %s: on %s: %w", j.as, j.on.Source, err))
			return
		}
		row, found = j.table.Lookup(key)
	}
	if !found {
		switch j.missing {
		case MissingDrop:
			return
		case MissingDeadLetter:
			out.DeadLetter(r, ReasonMissing, fmt.Errorf("join %s: no row for key %q (on %s)", j.as, key, j.on.Source))
			return
		}
	}
	if r.Bound == nil {
		r.Bound = make(map[string]any, 1)
	}
	r.shuffleKeyFor = nil // a later key may read the bound name
	if found {
		r.Bound[j.as] = row
	} else {
		// An untyped nil, so `as?.field` and `as == nil` behave as for a
		// missing value.
		r.Bound[j.as] = nil
	}
	out.Emit(r)
}
