package benchkit

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// StartProc runs bin (a benchmark's broker or proxy process) and waits up
// to 30 s for its "ready X" line; it returns the process and X.
func StartProc(bin string, args ...string) (*exec.Cmd, string) {
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		log.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), "ready "); ok {
				ready <- s
			}
		}
	}()
	select {
	case s := <-ready:
		return cmd, s
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		log.Fatalf("%s did not become ready", bin)
	}
	return nil, ""
}

// StopProc stops a process StartProc started: SIGTERM, then SIGKILL after
// 10 s.
func StopProc(cmd *exec.Cmd) {
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

// clockTicks is USER_HZ, the unit of utime/stime in /proc/PID/stat; it is
// 100 on every Linux ABI Go supports.
const clockTicks = 100

// ProcCPU is the user+system CPU time process pid has used so far.
func ProcCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		log.Fatal(err)
	}
	// The command name (field 2) may hold spaces; fields after ')' are fixed.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, _ := strconv.ParseInt(f[12], 10, 64) // field 15
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// Median is the median of v (0 for none).
func Median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// SendRecord is one pipeline-benchmark source record of size bytes: a JSON
// object with id, user, merchant, amount and its send time in send_ns,
// padded to size.
func SendRecord(topic string, id int, sendNS int64, size int) *kgo.Record {
	v := fmt.Appendf(make([]byte, 0, size), `{"id":%d,"user":"u%d","merchant":"m%d","amount":%d.5,"send_ns":%d,"pad":"`,
		id, id%100, id%120, id%1000, sendNS)
	if PadText {
		v = appendWords(v, uint64(id)+1, size-2)
	}
	for len(v) < size-2 {
		v = append(v, 'x')
	}
	v = append(v, '"', '}')
	return &kgo.Record{Topic: topic, Key: strconv.AppendInt(nil, int64(id), 10), Value: v}
}

// PadText pads SendRecords with words instead of a run of 'x'. A run of one
// byte is what snappy compresses best and decodes slowest (a copy at
// offset 1, byte by byte): with it, a drain's consumer spends a quarter of
// its CPU in s2.Decode. Words drawn from a small vocabulary compress about
// as text does. The benchmarks' -pad flag sets it (default: 'x', as all
// figures before 2026-12-02 were taken).
var PadText bool

var padWords = strings.Fields(`card payment merchant settled pending refund online store order ` +
	`customer account balance transfer review risk score device mobile browser session country ` +
	`amount currency invoice shipping address street city postal region priority standard express ` +
	`approved declined retry velocity geo rule alert batch ledger entry credit debit fee tax total ` +
	`discount coupon loyalty points tier gold silver bronze channel partner campaign source medium`)

// appendWords appends words chosen by a xorshift seeded with seed until v
// is n bytes long (the rest is left to the caller's padding).
func appendWords(v []byte, seed uint64, n int) []byte {
	x := seed*0x9E3779B97F4A7C15 | 1
	for {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		w := padWords[x%uint64(len(padWords))]
		if len(v)+len(w)+1 > n {
			return v
		}
		v = append(append(v, w...), ' ')
	}
}

var sendKey = []byte(`"send_ns":`)

// SendNS reads send_ns from an output value without decoding it whole, so
// a benchmark's consumer adds no JSON decoding to what it measures.
func SendNS(v []byte) (int64, bool) {
	i := bytes.Index(v, sendKey)
	if i < 0 {
		return 0, false
	}
	s := v[i+len(sendKey):]
	j := 0
	for j < len(s) && strings.IndexByte("0123456789+-.eE", s[j]) >= 0 {
		j++
	}
	f, err := strconv.ParseFloat(string(s[:j]), 64)
	if err != nil {
		return 0, false
	}
	return int64(f), true
}

// ModuleRoot is the directory of go.mod above the working directory.
func ModuleRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		log.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		p := filepath.Dir(dir)
		if p == dir {
			log.Fatal("no go.mod above the working directory")
		}
		dir = p
	}
}

// ProduceBacklog writes n SendRecords of size bytes to topic through cl
// (for a drain benchmark: the backlog a route or loop then drains), waits
// until all are acknowledged, and logs how long it took.
func ProduceBacklog(cl *kgo.Client, topic string, n, size int) error {
	t0 := time.Now()
	for i := 0; i < n; i++ {
		cl.Produce(context.Background(), SendRecord(topic, i, 0, size), func(_ *kgo.Record, err error) {
			if err != nil {
				log.Printf("backlog produce: %v", err)
			}
		})
	}
	if err := cl.Flush(context.Background()); err != nil {
		return err
	}
	log.Printf("backlog %s: %d records produced in %v", topic, n, time.Since(t0).Round(time.Millisecond))
	return nil
}
