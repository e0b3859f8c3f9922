// Package corpus generates API answers of the kinds a protected write
// stores: payment-intent-like objects, paginated lists of them, and error
// bodies, from 256 bytes to 64 KiB, with the response headers such an API
// sends. Every answer is made by code from a seed, so two runs with one
// seed give the same bytes: the memory and compression figures in
// docs/performance.md are reproducible, and no answer is copied from any
// real service.
//
// The values vary the way real ones do (random ids, amounts, names,
// timestamps), so the answers compress like live traffic, not like a
// repeated template.
package corpus

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// Class is a kind of answer.
type Class string

// The classes of answer.
const (
	// Object is one payment-intent-like object, about 1.2 KiB of JSON.
	Object Class = "object"
	// List is a paginated list of objects: ListItems of them make about
	// 17 KiB.
	List Class = "list"
	// Error is an error body, about 280 bytes.
	Error Class = "error"
	// Mixed draws one of the others per answer: objects mostly, lists of
	// 1 to 50 items (up to about 64 KiB), errors.
	Mixed Class = "mixed"
)

// Classes are the classes Generator makes, in the order the figures list
// them.
var Classes = []Class{Object, List, Error, Mixed}

// ListItems is the number of objects of a List answer.
const ListItems = 14

// MaxBody bounds every generated body.
const MaxBody = 64 << 10

// Generator makes answers from a seed. It is not safe for concurrent use.
type Generator struct {
	rng *rand.Rand
	seq int
}

// New returns a generator whose answers are fixed by seed.
func New(seed uint64) *Generator {
	return &Generator{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Answer returns the next answer of class c.
func (g *Generator) Answer(c Class) idem.Response {
	g.seq++
	switch c {
	case Order:
		return g.order()
	case List:
		return g.list(ListItems)
	case Error:
		return g.errorAnswer()
	case Mixed:
		switch n := g.rng.IntN(10); {
		case n < 6:
			return g.object()
		case n < 8:
			return g.list(1 + g.rng.IntN(50))
		default:
			return g.errorAnswer()
		}
	}
	return g.object()
}

// Answers returns n answers of class c.
func (g *Generator) Answers(c Class, n int) []idem.Response {
	out := make([]idem.Response, n)
	for i := range out {
		out[i] = g.Answer(c)
	}
	return out
}

const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

func (g *Generator) token(prefix string, n int) string {
	var b strings.Builder
	b.Grow(len(prefix) + n)
	b.WriteString(prefix)
	for range n {
		b.WriteByte(alnum[g.rng.IntN(len(alnum))])
	}
	return b.String()
}

func (g *Generator) pick(s []string) string { return s[g.rng.IntN(len(s))] }

var (
	firstNames = []string{"Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Radia", "Leslie",
		"Margaret", "Niklaus", "Shafi", "Tony", "Whitfield", "Yukihiro", "Anita", "Dennis", "Hedy", "Sophie"}
	lastNames = []string{"Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson",
		"Perlman", "Lamport", "Hamilton", "Wirth", "Goldwasser", "Hoare", "Diffie", "Matsumoto", "Borg", "Ritchie"}
	cities = []string{"Lisbon", "Porto", "Utrecht", "Leeds", "Lyon", "Graz", "Tartu", "Gdansk", "Bilbao", "Turin",
		"Aarhus", "Ghent", "Cork", "Brno", "Malmo"}
	countries  = []string{"PT", "NL", "GB", "FR", "AT", "EE", "PL", "ES", "IT", "DK", "BE", "IE", "CZ", "SE"}
	currencies = []string{"eur", "eur", "eur", "gbp", "usd", "sek", "dkk", "pln", "czk"}
	statuses   = []string{"succeeded", "succeeded", "succeeded", "requires_capture", "processing",
		"requires_payment_method", "requires_action", "canceled"}
	streets  = []string{"Rua", "Avenue", "Straat", "Road", "Calle", "Via", "Gade", "Ulica"}
	products = []string{"Annual plan", "Monthly plan", "Seat upgrade", "Storage add-on", "Support tier",
		"Hardware order", "Gift card", "Event ticket", "Shipping fee", "Consulting hours"}
	errorKinds = []struct{ typ, code, param, msg string }{
		{"invalid_request_error", "parameter_missing", "amount", "Missing required param: amount."},
		{"invalid_request_error", "parameter_invalid_integer", "amount", "Invalid integer: the amount must be a positive whole number of the currency's minor unit."},
		{"card_error", "card_declined", "", "Your card was declined."},
		{"card_error", "expired_card", "exp_month", "Your card has expired."},
		{"invalid_request_error", "resource_missing", "customer", "No such customer: '%s'"},
		{"api_error", "rate_limited", "", "Too many requests hit the API too quickly. Please retry with exponential backoff."},
		{"idempotency_error", "idempotency_key_in_use", "", "There is currently another in-progress request using this idempotency key."},
	}
)

// address is a postal address.
type address struct {
	Line1      string  `json:"line1"`
	Line2      *string `json:"line2"`
	City       string  `json:"city"`
	PostalCode string  `json:"postal_code"`
	Country    string  `json:"country"`
}

type shipping struct {
	Name    string  `json:"name"`
	Phone   string  `json:"phone"`
	Address address `json:"address"`
}

type cardDetails struct {
	Brand    string `json:"brand"`
	Last4    string `json:"last4"`
	ExpMonth int    `json:"exp_month"`
	ExpYear  int    `json:"exp_year"`
	Funding  string `json:"funding"`
	Country  string `json:"country"`
}

type paymentMethodDetails struct {
	Type string      `json:"type"`
	Card cardDetails `json:"card"`
}

// paymentIntent is shaped like the objects payment APIs return: ids with
// type prefixes, minor-unit amounts, Unix times, nested objects, nulls.
type paymentIntent struct {
	ID                   string               `json:"id"`
	Object               string               `json:"object"`
	Amount               int                  `json:"amount"`
	AmountCapturable     int                  `json:"amount_capturable"`
	AmountReceived       int                  `json:"amount_received"`
	Application          *string              `json:"application"`
	ApplicationFee       *int                 `json:"application_fee_amount"`
	CanceledAt           *int64               `json:"canceled_at"`
	CancellationReason   *string              `json:"cancellation_reason"`
	CaptureMethod        string               `json:"capture_method"`
	ClientSecret         string               `json:"client_secret"`
	ConfirmationMethod   string               `json:"confirmation_method"`
	Created              int64                `json:"created"`
	Currency             string               `json:"currency"`
	Customer             string               `json:"customer"`
	Description          string               `json:"description"`
	LatestCharge         string               `json:"latest_charge"`
	Livemode             bool                 `json:"livemode"`
	Metadata             map[string]string    `json:"metadata"`
	NextAction           *string              `json:"next_action"`
	OnBehalfOf           *string              `json:"on_behalf_of"`
	PaymentMethod        string               `json:"payment_method"`
	PaymentMethodDetails paymentMethodDetails `json:"payment_method_details"`
	PaymentMethodTypes   []string             `json:"payment_method_types"`
	ReceiptEmail         string               `json:"receipt_email"`
	SetupFutureUsage     *string              `json:"setup_future_usage"`
	Shipping             shipping             `json:"shipping"`
	StatementDescriptor  string               `json:"statement_descriptor"`
	Status               string               `json:"status"`
	TransferGroup        *string              `json:"transfer_group"`
}

func (g *Generator) intent() paymentIntent {
	first, last := g.pick(firstNames), g.pick(lastNames)
	amount := 100 + g.rng.IntN(250000)
	status := g.pick(statuses)
	received := 0
	if status == "succeeded" {
		received = amount
	}
	capturable := 0
	if status == "requires_capture" {
		capturable = amount
	}
	id := g.token("pi_", 24)
	created := int64(1_767_225_600 + g.rng.IntN(31_536_000))
	country := g.pick(countries)
	return paymentIntent{
		ID: id, Object: "payment_intent", Amount: amount, AmountCapturable: capturable, AmountReceived: received,
		CaptureMethod: g.pick([]string{"automatic", "automatic_async", "manual"}),
		ClientSecret:  id + "_secret_" + g.token("", 25), ConfirmationMethod: "automatic",
		Created: created, Currency: g.pick(currencies), Customer: g.token("cus_", 14),
		Description:  fmt.Sprintf("%s for order %d", g.pick(products), 100000+g.rng.IntN(900000)),
		LatestCharge: g.token("ch_", 24),
		Metadata: map[string]string{
			"order_id": fmt.Sprintf("ord_%08d", g.rng.IntN(100_000_000)),
			"cart_id":  g.token("cart_", 12),
			"channel":  g.pick([]string{"web", "ios", "android", "pos"}),
		},
		PaymentMethod: g.token("pm_", 24),
		PaymentMethodDetails: paymentMethodDetails{Type: "card", Card: cardDetails{
			Brand: g.pick([]string{"visa", "mastercard", "amex"}), Last4: fmt.Sprintf("%04d", g.rng.IntN(10000)),
			ExpMonth: 1 + g.rng.IntN(12), ExpYear: 2027 + g.rng.IntN(6),
			Funding: g.pick([]string{"credit", "debit"}), Country: country,
		}},
		PaymentMethodTypes: []string{"card"},
		ReceiptEmail:       strings.ToLower(first+"."+last) + fmt.Sprintf("%d@example.com", g.rng.IntN(1000)),
		Shipping: shipping{
			Name: first + " " + last, Phone: fmt.Sprintf("+3519%08d", g.rng.IntN(100_000_000)),
			Address: address{
				Line1: fmt.Sprintf("%s %s %d", g.pick(streets), g.pick(lastNames), 1+g.rng.IntN(300)),
				City:  g.pick(cities), PostalCode: fmt.Sprintf("%04d-%03d", g.rng.IntN(10000), g.rng.IntN(1000)),
				Country: country,
			},
		},
		StatementDescriptor: strings.ToUpper(g.pick(products)),
		Status:              status,
	}
}

// headers are what such an API sends with an answer (those a record
// keeps: no date, no content-length).
func (g *Generator) headers(location string) []idem.Header {
	hs := []idem.Header{
		{Name: "content-type", Value: "application/json"},
		{Name: "cache-control", Value: "no-cache, no-store"},
		{Name: "request-id", Value: g.token("req_", 14)},
		{Name: "api-version", Value: "2025-06-30"},
		{Name: "x-ratelimit-remaining", Value: fmt.Sprint(g.rng.IntN(1000))},
	}
	if location != "" {
		hs = append(hs, idem.Header{Name: "location", Value: location})
	}
	return hs
}

func (g *Generator) object() idem.Response {
	pi := g.intent()
	return idem.Response{Status: 200, Headers: g.headers("/v1/payment_intents/" + pi.ID), Body: marshal(pi)}
}

type listPage struct {
	Object  string          `json:"object"`
	Data    []paymentIntent `json:"data"`
	HasMore bool            `json:"has_more"`
	URL     string          `json:"url"`
	Next    string          `json:"next_page"`
}

func (g *Generator) list(items int) idem.Response {
	page := listPage{Object: "list", HasMore: true, URL: "/v1/payment_intents"}
	for range items {
		page.Data = append(page.Data, g.intent())
		if len(marshal(page)) > MaxBody {
			page.Data = page.Data[:len(page.Data)-1]
			break
		}
	}
	page.Next = g.token("page_", 32)
	return idem.Response{Status: 200, Headers: g.headers(""), Body: marshal(page)}
}

type apiError struct {
	Error struct {
		Type      string `json:"type"`
		Code      string `json:"code"`
		Param     string `json:"param,omitempty"`
		Message   string `json:"message"`
		RequestID string `json:"request_log_url"`
		DocURL    string `json:"doc_url"`
	} `json:"error"`
}

func (g *Generator) errorAnswer() idem.Response {
	k := errorKinds[g.rng.IntN(len(errorKinds))]
	var e apiError
	e.Error.Type, e.Error.Code, e.Error.Param = k.typ, k.code, k.param
	e.Error.Message = k.msg
	if strings.Contains(k.msg, "%s") {
		e.Error.Message = fmt.Sprintf(k.msg, g.token("cus_", 14))
	}
	e.Error.RequestID = "https://dashboard.example.com/logs/" + g.token("req_", 14)
	e.Error.DocURL = "https://docs.example.com/error-codes/" + strings.ReplaceAll(k.code, "_", "-")
	status := 400
	switch k.typ {
	case "card_error":
		status = 402
	case "api_error":
		status = 503
	case "idempotency_error":
		status = 409
	}
	if k.code == "resource_missing" {
		status = 404
	}
	return idem.Response{Status: status, Headers: g.headers(""), Body: marshal(e)}
}

func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only the types above, which always marshal
	}
	return b
}
