package operators

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
)

// Budgets on the work one record may cause.
//
// An expression is written by a rule author but evaluated on values a
// client produced: `repeat(value, 1000000)`, `split(value, ",")` on a 50 MB
// record of commas, or an `all` nested in an `all` over a long list each
// cost memory or time in proportion to the record times the expression.
// Every evaluation of an expression therefore carries a meter (in the
// record, so it costs no allocation): the functions that allocate in
// proportion to their inputs charge the bytes they are about to allocate
// BEFORE allocating, and every iteration of a predicate (`all`, `map`,
// `filter`, `reduce`, ...) charges one step; past the bound of either, or
// past the time bound, the evaluation fails with an error that wraps
// ErrBudget. A route step makes such a record a dead letter with reason
// `budget`; a guard refuses the batch with the error as the message.
//
// A record's fan-out (the records and window updates one input record
// causes in one chain of steps: explode copies times the windows each
// copy updates) has a budget too (Limits.FanOut).

// Limits are the per-record budgets. The zero value of a field means the
// default (DefaultLimits).
type Limits struct {
	// ExprBytes bounds the bytes one evaluation of one expression may
	// allocate through the functions that allocate in proportion to their
	// input (config limits.expr_memory_bytes).
	ExprBytes int64
	// ExprSteps bounds the predicate iterations (and sort comparisons) of
	// one evaluation (config limits.expr_steps).
	ExprSteps int64
	// ExprTime bounds the wall time of one evaluation, measured from its
	// first charged step or allocation (config limits.expr_time).
	ExprTime time.Duration
	// FanOut bounds the records and window updates one input record may
	// cause along one chain of steps (config limits.max_fanout).
	FanOut int64
	// OpenWindows bounds the open window states (window × key) of one
	// window step instance (config limits.max_open_windows).
	OpenWindows int64
}

// DefaultLimits are the limits of a proxy whose config sets none.
var DefaultLimits = Limits{
	ExprBytes:   32 << 20,
	ExprSteps:   1_000_000,
	ExprTime:    100 * time.Millisecond,
	FanOut:      100_000,
	OpenWindows: 1_000_000,
}

var limits atomic.Pointer[Limits]

func init() { SetLimits(Limits{}) }

// SetLimits sets the budgets every later evaluation uses; zero fields take
// the default. It is safe to call while expressions run (an evaluation in
// progress keeps the limits it started with).
func SetLimits(l Limits) {
	d := DefaultLimits
	if l.ExprBytes <= 0 {
		l.ExprBytes = d.ExprBytes
	}
	if l.ExprSteps <= 0 {
		l.ExprSteps = d.ExprSteps
	}
	if l.ExprTime <= 0 {
		l.ExprTime = d.ExprTime
	}
	if l.FanOut <= 0 {
		l.FanOut = d.FanOut
	}
	if l.OpenWindows <= 0 {
		l.OpenWindows = d.OpenWindows
	}
	limits.Store(&l)
}

// CurrentLimits returns the limits in effect.
func CurrentLimits() Limits { return *limits.Load() }

// ErrBudget is wrapped by every error of a budget that tripped.
var ErrBudget = errors.New("budget exceeded")

// The budgets, as BudgetTrips names them.
const (
	BudgetExprMemory  = "expr_memory"
	BudgetExprSteps   = "expr_steps"
	BudgetExprTime    = "expr_time"
	BudgetFanOut      = "fanout"
	BudgetOpenWindows = "open_windows"
)

// BudgetNames lists the budgets in a fixed order.
var BudgetNames = []string{BudgetExprMemory, BudgetExprSteps, BudgetExprTime, BudgetFanOut, BudgetOpenWindows}

var trips [5]atomic.Uint64

func budgetIndex(name string) int {
	for i, n := range BudgetNames {
		if n == name {
			return i
		}
	}
	panic("unknown budget " + name)
}

// BudgetTrips returns how many times the budget name has tripped since the
// process started (for a counter on the proxy's registry).
func BudgetTrips(name string) uint64 { return trips[budgetIndex(name)].Load() }

// budgetError is one budget that tripped.
type budgetError struct {
	budget string
	msg    string
}

func (e *budgetError) Error() string { return e.msg }

// BudgetOf names the budget err (or an error it wraps) tripped: one of
// BudgetNames, BudgetExprMemory for expr's own memory budget, "" when err
// is not a budget's.
func BudgetOf(err error) string {
	var b *budgetError
	if errors.As(err, &b) {
		return b.budget
	}
	if IsBudget(err) {
		return BudgetExprMemory
	}
	return ""
}
func (e *budgetError) Is(target error) bool { return target == ErrBudget }

func tripped(budget, format string, args ...any) error {
	trips[budgetIndex(budget)].Add(1)
	return &budgetError{budget: budget, msg: fmt.Sprintf(format, args...)}
}

// IsBudget reports whether err is (or wraps) a budget that tripped,
// including expr's own memory budget (ranges and arrays), which fails with
// a plain message.
func IsBudget(err error) bool {
	if err == nil {
		return false
	}
	return errors.Is(err, ErrBudget) || strings.Contains(err.Error(), "memory budget exceeded")
}

// evalReason is the dead-letter reason of an evaluation that failed.
func evalReason(err error) Reason {
	if IsBudget(err) {
		return ReasonBudget
	}
	return ReasonError
}

// meter is the budget of one evaluation. It lives in the Record; evalVM
// resets it before every run.
type meter struct {
	lim   *Limits
	bytes int64 // charged so far
	steps int64
	start time.Time // of the first charge; zero until then
	next  int64     // steps at which the clock is read next
}

// timeEvery is how many steps pass between two readings of the clock.
const timeEvery = 256

func (m *meter) reset() {
	*m = meter{lim: limits.Load()}
}

// alloc charges n bytes that the function what is about to allocate.
func (m *meter) alloc(what string, n int64) error {
	if m == nil || m.lim == nil {
		// An expression run outside Eval (no meter): still refuse one
		// allocation over the whole budget.
		if lim := limits.Load(); n > lim.ExprBytes || n < 0 {
			return tripped(BudgetExprMemory, "expression budget exceeded: %s would allocate %s, over the limit of %d bytes per evaluation (limits.expr_memory_bytes)", what, sizeText(n), lim.ExprBytes)
		}
		return nil
	}
	if n < 0 || n > m.lim.ExprBytes-m.bytes {
		return tripped(BudgetExprMemory, "expression budget exceeded: %s would allocate %s, and the evaluation has %d of its %d bytes left (limits.expr_memory_bytes)", what, sizeText(n), m.lim.ExprBytes-m.bytes, m.lim.ExprBytes)
	}
	m.bytes += n
	return m.clock()
}

// step charges n steps (predicate iterations, comparisons).
func (m *meter) step(n int64) error {
	if m == nil || m.lim == nil {
		return nil
	}
	if n < 0 || n > m.lim.ExprSteps-m.steps {
		return tripped(BudgetExprSteps, "expression budget exceeded: more than %d steps (predicate iterations, comparisons) in one evaluation (limits.expr_steps)", m.lim.ExprSteps)
	}
	m.steps += n
	if m.steps >= m.next {
		m.next = m.steps + timeEvery
		return m.clock()
	}
	return nil
}

// clock checks the time bound.
func (m *meter) clock() error {
	now := time.Now()
	if m.start.IsZero() {
		m.start = now
		return nil
	}
	if d := now.Sub(m.start); d > m.lim.ExprTime {
		return tripped(BudgetExprTime, "expression budget exceeded: the evaluation ran for more than %v (limits.expr_time)", m.lim.ExprTime)
	}
	return nil
}

// sizeText is n bytes for an error message; n < 0 is an overflow.
func sizeText(n int64) string {
	if n < 0 {
		return "more than 2^63 bytes"
	}
	return fmt.Sprintf("%d bytes", n)
}

// mulSize is a*b, or -1 when it overflows or either is negative.
func mulSize(a, b int64) int64 {
	if a < 0 || b < 0 {
		return -1
	}
	if a == 0 || b == 0 {
		return 0
	}
	if a > (1<<63-1)/b {
		return -1
	}
	return a * b
}

// addSize is a+b, or -1 when it overflows or either is negative.
func addSize(a, b int64) int64 {
	if a < 0 || b < 0 || a > 1<<63-1-b {
		return -1
	}
	return a + b
}

// fanout is the fan-out budget of one input record, shared by the records
// the steps make of it (explode copies, window rows): each charge counts
// against the same total.
type fanout struct {
	used    int64
	limit   int64
	tripped bool
}

// chargeFanOut charges n outputs or window updates of r against the
// fan-out budget of the input record it came from. The first charge over
// the budget returns the error (the caller dead-letters r with reason
// budget); every later one of the same input record returns errFanOutSpent
// (the caller drops r: the input record is already a dead letter).
func chargeFanOut(r *Record, what string, n int64) error {
	f := r.fan
	if f == nil {
		f = &fanout{limit: limits.Load().FanOut}
		r.fan = f
	}
	if f.tripped {
		return errFanOutSpent
	}
	if n > f.limit-f.used {
		f.tripped = true
		return tripped(BudgetFanOut, "fan-out budget exceeded: %s would make %d more records or window updates of one input record, which has %d of its %d left (limits.max_fanout); the rest of its fan-out is dropped",
			what, n, f.limit-f.used, f.limit)
	}
	f.used += n
	return nil
}

// errFanOutSpent is chargeFanOut's answer after the budget tripped.
var errFanOutSpent = errors.New("fan-out budget of the input record already exceeded")
