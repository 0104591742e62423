package canonjson

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"
)

// benchPayload is a realistic event as a producer would emit it: struct
// field order (not sorted), some nesting, an array of line items, a few
// escapes, and volatile metadata that the inbox ignores.
var benchPayload = []byte(`{
  "event_type": "order.placed",
  "event_version": 3,
  "order_id": "ord_01HZX8K2M4V9Q7T3N5B6C8D0EF",
  "customer": {
    "id": "cus_8f2a91c4",
    "email": "jane.doe@example.com",
    "name": "Jane \"JD\" Doe",
    "locale": "de-DE",
    "tier": "gold"
  },
  "shipping_address": {
    "line1": "Hauptstra\u00dfe 12",
    "line2": null,
    "city": "M\u00fcnchen",
    "postal_code": "80331",
    "country": "DE"
  },
  "items": [
    {"sku": "SKU-1001", "name": "Espresso beans 1kg", "quantity": 2, "unit_price": "18.90", "currency": "EUR", "tags": ["coffee", "beans"]},
    {"sku": "SKU-2040", "name": "Milk frother", "quantity": 1, "unit_price": "49.00", "currency": "EUR", "tags": []},
    {"sku": "SKU-3300", "name": "Ceramic cup <set of 4>", "quantity": 1, "unit_price": "24.50", "currency": "EUR", "tags": ["kitchen"]}
  ],
  "totals": {"subtotal": "111.30", "shipping": "4.90", "tax": "22.08", "grand_total": "138.28", "currency": "EUR"},
  "payment": {"method": "card", "brand": "visa", "last4": "4242", "captured": true, "amount_minor": 13828},
  "discount_codes": ["SPRING10"],
  "notes": "Leave at the door\/porch, ring twice.\nThanks!",
  "meta": {
    "sent_at": "2024-05-01T10:00:07.123Z",
    "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
    "producer": "checkout-service",
    "attempt": 1
  }
}`)

var benchIgnore = []Path{{"meta", "sent_at"}, {"meta", "trace_id"}, {"meta", "attempt"}}

func BenchmarkCanonicalize(b *testing.B) {
	b.Run("event", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(benchPayload)))
		for b.Loop() {
			if _, err := Canonicalize(benchPayload, benchIgnore); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The canonical form as input: compact, already sorted, no escapes,
	// the fast path of every step.
	canonical, err := Canonicalize(benchPayload, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("canonical", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(canonical)))
		for b.Loop() {
			if _, err := Canonicalize(canonical, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// leafDepth is how deep writeLeaf nests: the array, its objects and their
// "k" arrays.
const leafDepth = 3

// deepObjects returns depth nested objects, each with its members out of
// key order, around an array of about leaf bytes. This is the shape that
// costs the most per byte if an object's text is moved once per enclosing
// object: every byte of the leaf sits under depth unsorted objects.
func deepObjects(depth, leaf int) []byte {
	var b bytes.Buffer
	for range depth {
		b.WriteString(`{"b":0,"a":`)
	}
	writeLeaf(&b, leaf)
	b.WriteString(strings.Repeat("}", depth))
	return b.Bytes()
}

// deepArrays is deepObjects with arrays for the enclosing levels and unsorted
// objects inside the leaf, so the nesting itself never needs reordering.
func deepArrays(depth, leaf int) []byte {
	var b bytes.Buffer
	b.WriteString(strings.Repeat("[", depth))
	b.WriteString(`{"z":0,"y":`)
	writeLeaf(&b, leaf)
	b.WriteString(`}`)
	b.WriteString(strings.Repeat("]", depth))
	return b.Bytes()
}

// deepMixed alternates unsorted objects and arrays, depth levels in all.
func deepMixed(depth, leaf int) []byte {
	var b bytes.Buffer
	for range depth / 2 {
		b.WriteString(`{"b":0,"a":[`)
	}
	writeLeaf(&b, leaf)
	b.WriteString(strings.Repeat("]}", depth/2))
	return b.Bytes()
}

// writeLeaf writes an array of about n bytes of small unsorted objects.
func writeLeaf(b *bytes.Buffer, n int) {
	b.WriteByte('[')
	for i, end := 0, b.Len()+n; b.Len() < end; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(b, `{"v":%d,"s":"item \u00e9 %d","k":[1,2]}`, i, i)
	}
	b.WriteByte(']')
}

// wideObject returns one object with n members in reverse key order.
func wideObject(n int) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i := n - 1; i >= 0; i-- {
		if i < n-1 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"key%07d":%d`, i, i)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// largeDocument returns an export of about n bytes: a batch of events like
// benchPayload, each under its own key, as a producer that marshals a map or
// a struct of records would write it.
func largeDocument(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"batch_id":"b_01HZX8","records":{`)
	for i := 0; b.Len() < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		// Keys descend so the object needs sorting too.
		fmt.Fprintf(&b, `"rec_%08d":`, 1<<26-i)
		b.Write(benchPayload)
	}
	b.WriteString(`},"count":0}`)
	return b.Bytes()
}

// BenchmarkWorstCase measures the shapes that cost the most per input byte,
// each next to a plain SHA-256 of the same bytes: the fallback a caller
// takes for a refused document, and the floor of what a fingerprint costs.
func BenchmarkWorstCase(b *testing.B) {
	const mib = 1 << 20
	for _, bc := range []struct {
		name string
		data []byte
	}{
		// Nested maxDepth-1 deep in all, leaf included.
		{"deep_objects_999", deepObjects(maxDepth-1-leafDepth, mib)},
		{"deep_objects_999_10MiB", deepObjects(maxDepth-1-leafDepth, 10*mib)},
		{"deep_arrays_999", deepArrays(maxDepth-2-leafDepth, mib)},
		{"deep_mixed_999", deepMixed(maxDepth-1-leafDepth, mib)},
		{"wide_100k", wideObject(100_000)},
		{"document_10MiB", largeDocument(10 * mib)},
	} {
		b.Run(bc.name+"/canonicalize", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.data)))
			for b.Loop() {
				if _, err := Canonicalize(bc.data, benchIgnore); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc.name+"/sha256", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.data)))
			for b.Loop() {
				sha256.Sum256(bc.data)
			}
		})
	}
}
