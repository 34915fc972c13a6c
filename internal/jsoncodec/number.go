package jsoncodec

import "math"

// ToFloat reports v as a float64 if it is any Go number a value tree holds
// (JSON's float64, the integers and float32 Avro and Protobuf decode to) (NaN, false when
// it is not one).
func ToFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case int32:
		return float64(x), true
	case float32:
		return float64(x), true
	case int8:
		return float64(x), true
	case int16:
		return float64(x), true
	case uint:
		return float64(x), true
	case uint8:
		return float64(x), true
	case uint16:
		return float64(x), true
	case uint32:
		return float64(x), true
	case uint64:
		return float64(x), true
	}
	return math.NaN(), false
}
