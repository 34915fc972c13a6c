package operators

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
)

// The helpers that views (rules.View) use to hide what a client must not
// read, usable in every expression:
//
//   - mask(s, keep_last): s with every character but the last keep_last
//     replaced by `*`. A string of keep_last characters or fewer is masked
//     whole, so mask never shows a short value in clear. A number is masked
//     as its decimal text; nil stays nil.
//   - hash(s): the keyed hash of s, HMAC-SHA256 in lower-case hex (64
//     characters), keyed with the salt of the record (Record.HashKey, a
//     view's hash_salt_file). Equal inputs give equal outputs under one
//     salt, so a hashed field can still be joined or counted on, but
//     without the salt nobody can test a guess. A number is hashed as its
//     decimal text; nil stays nil. Without a salt hash fails: rules refuses
//     hash() in a file that has none.
//
// Both are budgeted like the allocating built-ins (exprfuncs.go): the
// budget patcher rewrites a call into rtproxy_<name>__ with the
// evaluation's meter (and, for hash, the salt) as first arguments.

const (
	maskName    = "mask"
	hashName    = "hash"
	hashKeyName = "rtproxy_hash_key__" // the env field holding the record's salt
	// HashHexLen is the length of what hash returns.
	HashHexLen = 2 * sha256.Size
)

// HelperFuncs are the names of the helper functions, for tools that list
// what an expression may call.
var HelperFuncs = []string{maskName, hashName}

// errNoSalt is hash() run on a record without a salt.
var errNoSalt = errors.New("hash: no salt: hash() works only in a view with `hash_salt_file`")

// helperCheck declares mask and hash as written, for the check compile
// (CompileExpr's first, unpatched compile), with their types.
var helperCheck = []expr.Option{
	expr.Function(maskName, func(args ...any) (any, error) { return mask(nil, args[0], args[1]) },
		new(func(any, int) any)),
	expr.Function(hashName, func(args ...any) (any, error) { return hashValue(nil, nil, args[0]) },
		new(func(any) any)),
}

// helperBudgeted declares the functions the budget patcher calls instead.
var helperBudgeted = []expr.Option{
	expr.Function(budgetedName(maskName), func(args ...any) (any, error) {
		m, _ := args[0].(*meter)
		return mask(m, args[1], args[2])
	}),
	expr.Function(budgetedName(hashName), func(args ...any) (any, error) {
		m, _ := args[0].(*meter)
		key, _ := args[1].([]byte)
		return hashValue(m, key, args[2])
	}),
}

// patchHelper rewrites a call of mask or hash (the callee as written, an
// identifier) to its budgeted form; it reports whether it did.
func patchHelper(node *ast.Node) bool {
	c, ok := (*node).(*ast.CallNode)
	if !ok {
		return false
	}
	id, ok := c.Callee.(*ast.IdentifierNode)
	if !ok {
		return false
	}
	var args []ast.Node
	switch id.Value {
	case maskName:
		args = append([]ast.Node{meterNode()}, c.Arguments...)
	case hashName:
		args = append([]ast.Node{meterNode(), &ast.IdentifierNode{Value: hashKeyName}}, c.Arguments...)
	default:
		return false
	}
	ast.Patch(node, &ast.CallNode{Callee: &ast.IdentifierNode{Value: budgetedName(id.Value)}, Arguments: args})
	return true
}

// helperText is the text mask and hash work on: a string as it is, a
// number or bool as its decimal (JSON) text. ok is false for nil.
func helperText(name string, v any) (s string, ok bool, err error) {
	switch x := v.(type) {
	case nil:
		return "", false, nil
	case string:
		return x, true, nil
	case bool:
		return strconv.FormatBool(x), true, nil
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), true, nil
	case int:
		return strconv.Itoa(x), true, nil
	case int64:
		return strconv.FormatInt(x, 10), true, nil
	}
	if k, err := keyString(v); err == nil {
		return k, true, nil
	}
	return "", false, fmt.Errorf("%s: argument is %s, not a string or number", name, jsonKind(v))
}

// mask replaces all but the last keep characters of v with '*'.
func mask(m *meter, v, keep any) (any, error) {
	n, ok := argInt(keep)
	if !ok {
		return nil, fmt.Errorf("mask: keep_last is %T, not a whole number", keep)
	}
	if n < 0 {
		return nil, fmt.Errorf("mask: keep_last is %d; it must be 0 or more", n)
	}
	s, ok, err := helperText(maskName, v)
	if err != nil || !ok {
		return nil, err
	}
	// The result is never longer than s: each masked character, of one
	// to four bytes, becomes one byte.
	if err := m.alloc(maskName, int64(len(s))); err != nil {
		return nil, err
	}
	chars := int64(utf8.RuneCountInString(s))
	if err := m.step(chars); err != nil {
		return nil, err
	}
	hide := chars - n
	if chars <= n {
		hide = chars // a value no longer than what is kept is hidden whole
	}
	// Characters as range reads them (an invalid byte is one); what is
	// kept is copied as it was, bytes and all, so the result is never
	// longer than s.
	out := make([]byte, 0, len(s))
	i := int64(0)
	for at := range s {
		if i == hide {
			out = append(out, s[at:]...)
			break
		}
		out = append(out, '*')
		i++
	}
	return string(out), nil
}

// hashValue is HMAC-SHA256(key, v) in hex.
func hashValue(m *meter, key []byte, v any) (any, error) {
	s, ok, err := helperText(hashName, v)
	if err != nil || !ok {
		return nil, err
	}
	if len(key) == 0 {
		return nil, errNoSalt
	}
	if err := m.alloc(hashName, HashHexLen+sha256.Size); err != nil {
		return nil, err
	}
	// One step per block the hash reads.
	if err := m.step(int64(len(s))/sha256.BlockSize + 1); err != nil {
		return nil, err
	}
	return HashString(key, s), nil
}

// HashString is what hash(s) gives with the salt key: HMAC-SHA256 of s in
// lower-case hex.
func HashString(key []byte, s string) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(s))
	return hex.EncodeToString(h.Sum(nil))
}

// UsesHash reports whether the expression calls hash().
func (e *Expr) UsesHash() bool { return e.hash }

// hashFinder finds a call of hash in an expression as written.
type hashFinder struct{ found bool }

func (f *hashFinder) Visit(node *ast.Node) {
	if c, ok := (*node).(*ast.CallNode); ok {
		if id, ok := c.Callee.(*ast.IdentifierNode); ok && id.Value == hashName {
			f.found = true
		}
	}
}
