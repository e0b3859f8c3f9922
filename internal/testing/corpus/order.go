package corpus

import (
	"fmt"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// Order is an order of a shop API of another style than the other
// classes: camelCase field names, UUIDs, ISO 8601 times, line items, with
// headers of its own. The built-in dictionary's words (internal/compress)
// were chosen from the conventions of APIs like the other classes, so
// Order measures how compression carries to an API whose words it does
// not hold. It is not in Classes: sizing's table is of those.
const Order Class = "order"

// Measured lists the classes compression and memory are measured on:
// Classes, then Order.
var Measured = append(Classes[:len(Classes):len(Classes)], Order)

type orderLine struct {
	LineItemID        string `json:"lineItemId"`
	SKU               string `json:"sku"`
	Title             string `json:"title"`
	Quantity          int    `json:"quantity"`
	UnitPriceCents    int    `json:"unitPriceCents"`
	TaxCents          int    `json:"taxCents"`
	FulfillmentStatus string `json:"fulfillmentStatus"`
}

type shopOrder struct {
	OrderID     string `json:"orderId"`
	OrderNumber string `json:"orderNumber"`
	CreatedTime string `json:"createdTime"`
	Buyer       struct {
		BuyerID      string `json:"buyerId"`
		EmailAddress string `json:"emailAddress"`
		FullName     string `json:"fullName"`
	} `json:"buyer"`
	ShipTo struct {
		Street     string `json:"street"`
		Town       string `json:"town"`
		Postcode   string `json:"postcode"`
		CountryISO string `json:"countryIso"`
	} `json:"shipTo"`
	LineItems      []orderLine `json:"lineItems"`
	PricingSummary struct {
		SubtotalCents   int    `json:"subtotalCents"`
		ShippingCents   int    `json:"shippingCents"`
		GrandTotalCents int    `json:"grandTotalCents"`
		CurrencyCode    string `json:"currencyCode"`
	} `json:"pricingSummary"`
	PaymentSummary struct {
		PaymentRef  string `json:"paymentRef"`
		Method      string `json:"method"`
		CardNetwork string `json:"cardNetwork"`
		LastDigits  string `json:"lastDigits"`
		Authorized  bool   `json:"authorized"`
	} `json:"paymentSummary"`
	FulfillmentStatus string  `json:"orderFulfillmentStatus"`
	PaymentStatus     string  `json:"orderPaymentStatus"`
	SellerNote        *string `json:"sellerNote"`
	SalesChannel      string  `json:"salesChannel"`
}

var (
	itemTitles  = []string{"Stoneware Mug", "Travel Backpack 30L", "Wireless Charger", "Notebook A5 Dotted", "Desk Lamp", "Merino Socks"}
	networks    = []string{"VISA", "MASTERCARD", "AMEX", "MAESTRO"}
	channels    = []string{"WEB", "WEB", "IOS_APP", "ANDROID_APP", "MARKETPLACE"}
	orderStates = []string{"NOT_STARTED", "NOT_STARTED", "IN_PROGRESS", "FULFILLED"}
)

// uuid is a random version 4 UUID, in its text form.
func (g *Generator) uuid() string {
	a, b := g.rng.Uint64(), g.rng.Uint64()
	return fmt.Sprintf("%08x-%04x-4%03x-%04x-%012x", a>>32, a>>16&0xffff, a&0xfff, 0x8000|b>>48&0x3fff, b&0xffffffffffff)
}

func (g *Generator) order() idem.Response {
	var o shopOrder
	o.OrderID = g.uuid()
	o.OrderNumber = fmt.Sprintf("%02d-%05d-%05d", 10+g.rng.IntN(90), g.rng.IntN(100000), g.rng.IntN(100000))
	o.CreatedTime = fmt.Sprintf("2026-%02d-%02dT%02d:%02d:%02d.%03dZ", 1+g.rng.IntN(12), 1+g.rng.IntN(28),
		g.rng.IntN(24), g.rng.IntN(60), g.rng.IntN(60), g.rng.IntN(1000))
	o.Buyer.BuyerID = g.token("", 16)
	first, last := g.pick(firstNames), g.pick(lastNames)
	o.Buyer.FullName = first + " " + last
	o.Buyer.EmailAddress = fmt.Sprintf("%s.%s%d@mail.test", first, last, g.rng.IntN(100))
	o.ShipTo.Street = fmt.Sprintf("%d %s %s", 1+g.rng.IntN(300), g.pick(lastNames), g.pick(streets))
	o.ShipTo.Town = g.pick(cities)
	o.ShipTo.Postcode = fmt.Sprintf("%04d", g.rng.IntN(10000))
	o.ShipTo.CountryISO = g.pick(countries)
	subtotal := 0
	for range 1 + g.rng.IntN(3) {
		l := orderLine{LineItemID: g.token("", 12), SKU: "SKU-" + g.token("", 6), Title: g.pick(itemTitles),
			Quantity: 1 + g.rng.IntN(4), UnitPriceCents: 99 + g.rng.IntN(20000), FulfillmentStatus: "UNFULFILLED"}
		l.TaxCents = l.UnitPriceCents * l.Quantity / 5
		subtotal += l.UnitPriceCents * l.Quantity
		o.LineItems = append(o.LineItems, l)
	}
	o.PricingSummary.SubtotalCents = subtotal
	o.PricingSummary.ShippingCents = g.rng.IntN(2000)
	o.PricingSummary.GrandTotalCents = subtotal + o.PricingSummary.ShippingCents
	o.PricingSummary.CurrencyCode = "EUR"
	o.PaymentSummary.PaymentRef = "PAY" + g.token("", 18)
	o.PaymentSummary.Method = "CREDIT_CARD"
	o.PaymentSummary.CardNetwork = g.pick(networks)
	o.PaymentSummary.LastDigits = fmt.Sprintf("%04d", g.rng.IntN(10000))
	o.PaymentSummary.Authorized = true
	o.FulfillmentStatus = g.pick(orderStates)
	o.PaymentStatus = "PAID"
	o.SalesChannel = g.pick(channels)
	hs := []idem.Header{
		{Name: "content-type", Value: "application/json;charset=UTF-8"},
		{Name: "x-shop-trace", Value: g.uuid()},
		{Name: "x-shop-api-release", Value: "v3.14"},
		{Name: "cache-control", Value: "private, max-age=0"},
		{Name: "x-shop-quota-left", Value: fmt.Sprint(g.rng.IntN(5000))},
		{Name: "location", Value: "/shop/v3/orders/" + o.OrderID},
	}
	return idem.Response{Status: 201, Headers: hs, Body: marshal(o)}
}
