package protocol

// Guards that cannot always check a record now: a guard on an Avro or
// Protobuf topic decodes each value with its schema from a schema
// registry, and a registry that does not answer (within the guard's
// bound) leaves the record neither good nor bad. Such a partition is
// refused with REQUEST_TIMED_OUT, which every producer retries (the batch
// never reached a broker, so an idempotent producer's retry keeps its
// sequence), instead of INVALID_RECORD, which fails the records for good.

// RetriableGuard is a Guard that can fail to check a record for a
// passing reason. The proxy calls CheckRetriable instead of Check.
type RetriableGuard interface {
	Guard
	// CheckRetriable is Check; retry true says the record could not be
	// checked now (ok is false, check and message say why): its partition
	// is refused with REQUEST_TIMED_OUT, unless a record before it failed
	// a check, and the records after it are not checked.
	CheckRetriable(topic string, partition int32, rec *ProducedRecord) (check, message string, ok, retry bool)
}

// checkRecord checks one record with g.
func checkRecord(g Guard, topic string, partition int32, rec *ProducedRecord) (check, message string, ok, retry bool) {
	if rg, is := g.(RetriableGuard); is {
		return rg.CheckRetriable(topic, partition, rec)
	}
	check, message, ok = g.Check(topic, partition, rec)
	return check, message, ok, false
}

// Retriable reports whether the refusal is for a record that could not be
// checked now (RetriableGuard), not for a failed check: the producer
// retries the records, so they are not dead letters.
func (r *Refusal) Retriable() bool {
	return r.Err == nil && len(r.Failures) == 1 && r.Failures[0].Retry
}
