package canonjson

import (
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
