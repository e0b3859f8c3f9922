package compress

import "strings"

// BuiltinID is the id of the built-in dictionary in every frame that uses
// it. Its content below must never change: records in a store name it.
// Another vocabulary would be another dictionary with another id, this
// one kept for reading.
const BuiltinID = 1

// builtinVocabulary is what a JSON API's answers share with each other,
// whatever the API: header names and values, JSON punctuation, the field
// names and values REST APIs use for ids, times, money, people,
// addresses, pages and errors (RFC 9457's problem details among them). It
// is written by hand from those conventions, not trained on any corpus.
// zstd finds repeats nearest the end of a dictionary at the shortest
// offsets, so the most common words come last.
var builtinVocabulary = strings.Join([]string{
	// Headers a record keeps (never date or content-length).
	"strict-transport-security: max-age=31536000; includeSubDomains; preload",
	"x-content-type-options: nosniff", "x-frame-options: DENY", "referrer-policy: no-referrer",
	"vary: Origin, Accept-Encoding", "access-control-allow-origin: *", "access-control-expose-headers: ",
	"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "ratelimit-policy", "retry-after",
	"etag: W/\"", "last-modified", "link: <https://", ">; rel=\"next\"", "server", "x-powered-by",
	"x-request-id", "x-correlation-id", "x-trace-id", "traceparent", "request-id", "api-version",
	"idempotency-key", "idempotent-replayed", "location: /v1/", "location: /api/",
	"cache-control: no-cache, no-store, must-revalidate", "cache-control: private, no-store",
	"cache-control: no-store", "content-type: application/problem+json",
	"content-type: application/json; charset=utf-8", "content-type: application/json",
	"content-typeapplication/jsoncache-controlno-cache, no-storeno-storeprivate",
	// Problem details (RFC 9457) and common error envelopes.
	`{"type":"about:blank","title":"Bad Request","status":400,"detail":"","instance":"/`,
	`"title":"Not Found","status":404,`, `"title":"Conflict","status":409,`,
	`"title":"Unprocessable Entity","status":422,`, `"title":"Internal Server Error","status":500,`,
	`"title":"Service Unavailable","status":503,`, `"title":"Too Many Requests","status":429,`,
	`{"errors":[{"code":"","message":"","field":"","path":["`, `"validation_error","invalid_request","not_found",`,
	`"unauthorized","forbidden","conflict","rate_limited","internal_error",`,
	`{"error":{"type":"","code":"","message":"","param":"","doc_url":"https://docs.`, `"request_id":"req_`,
	`"trace_id":"`, `"details":[`, `"reason":"`, `"hint":"`, `"retryable":false,`,
	// Pagination and envelopes.
	`{"object":"list","data":[`, `],"has_more":false,"url":"/v1/`, `],"has_more":true,"url":"/v1/`,
	`"next_cursor":"`, `"previous_cursor":null,`, `"next_page":null,`, `"page":1,"per_page":`, `"page_size":`,
	`"total_count":`, `"total_pages":`, `"links":{"self":{"href":"https://`, `"next":{"href":"`, `"prev":null,`,
	`"first":`, `"last":`, `"meta":{`, `"items":[{`, `"results":[{`, `"count":`, `"offset":0,"limit":`,
	// Money, commerce, payments.
	`"amount":`, `"amount_total":`, `"amount_due":`, `"amount_paid":`, `"amount_refunded":0,`,
	`"amount_received":`, `"amount_capturable":0,`, `"subtotal":`, `"total":`, `"tax":`, `"tax_rate":`,
	`"discount":null,`, `"discounts":[],`, `"fee":`, `"fees":[],`, `"net":`, `"balance":`, `"price":`,
	`"unit_price":`, `"unit_amount":`, `"quantity":1,`, `"currency":"usd",`, `"currency":"eur",`,
	`"currency":"gbp",`, `"invoice":null,`, `"invoice_id":"`, `"order":`, `"order_id":"`, `"order_number":"`,
	`"sku":"`, `"product":"prod_`, `"product_id":"`, `"price_id":"price_`, `"subscription":null,`,
	`"plan":`, `"charge":"ch_`, `"charges":`, `"refund":`, `"refunds":[],`, `"dispute":null,`,
	`"payment":`, `"payment_id":"`, `"payment_intent":"pi_`, `"payment_method":"pm_`,
	`"payment_method_types":["card"],`, `"payment_status":"paid",`, `"source":null,`,
	`"card":{"brand":"visa","checks":{},"country":"US","exp_month":`, `"exp_year":`, `"fingerprint":"`,
	`"funding":"credit","last4":"`, `"mastercard","amex","debit","prepaid",`, `"wallet":null,`,
	`"billing_details":{`, `"shipping":{`, `"receipt_email":`, `"receipt_url":"https://`,
	`"statement_descriptor":null,`, `"capture_method":"automatic",`, `"transaction_id":"`, `"reference":"`,
	`"authorization_code":"`, `"captured":true,`, `"paid":true,`, `"refunded":false,`,
	`"succeeded","pending","failed","canceled","cancelled","processing","requires_action",`,
	`"requires_payment_method","requires_capture","requires_confirmation","authorized","captured",`,
	`"draft","open","paid","void","active","inactive","completed","expired","approved","declined",`,
	// People and addresses.
	`"customer":"cus_`, `"customer_id":"`, `"user":`, `"user_id":"`, `"account":"acct_`, `"account_id":"`,
	`"merchant_id":"`, `"tenant_id":"`, `"owner":`, `"name":"`, `"first_name":"`, `"last_name":"`,
	`"full_name":"`, `"display_name":"`, `"username":"`, `"email":"`, `"@example.com"`, `"phone":"+`,
	`"address":{"line1":"`, `"line2":null,`, `"city":"`, `"state":null,`, `"region":"`,
	`"postal_code":"`, `"zip":"`, `"country":"`, `"country_code":"`, `"locale":"en-US",`,
	`"language":"en",`, `"timezone":"UTC",`,
	// Ids, times, versions, bookkeeping.
	`"created":`, `"updated":`, `"created_at":"`, `"updated_at":"`, `"deleted_at":null,`, `"expires_at":`,
	`"completed_at":null,`, `"canceled_at":null,`, `"cancellation_reason":null,`, `"timestamp":"`,
	`"date":"`, `T00:00:00Z"`, `T00:00:00.000Z"`, `"version":`, `"api_version":"`, `"revision":`,
	`"livemode":false,`, `"test_mode":false,`, `"environment":"production",`, `"application":null,`,
	`"description":`, `"notes":null,`, `"comment":null,`, `"tags":[],`, `"labels":{},`, `"attributes":{`,
	`"metadata":{}`, `"metadata":{"`, `"client_secret":"`, `"url":"https://`, `"href":"https://`,
	`"uri":"`, `"path":"/`, `"method":"POST",`, `"status_code":`, `"success":true,`, `"ok":true,`,
	`"result":`, `"response":`, `"request":`, `"data":{`, `"kind":"`, `"category":"`, `"channel":"`,
	`"mode":"`, `"status":"`, `"state":"`, `"object":"`, `"type":"`, `"code":"`, `"message":"`,
	`"next_action":null,`, `"enabled":true,`, `"default":false,`, `"primary":true,`,
	`":null,"`, `":true,"`, `":false,"`, `":[],"`, `":{},"`, `":0,"`, `"},"`, `"}],"`, `"id":"`,
}, "")

// Builtin returns the built-in dictionary: what compresses a policy's
// answers until it names a trained one, and what the records it
// compressed keep needing.
func Builtin() *Dictionary {
	return &Dictionary{id: BuiltinID, raw: []byte(builtinVocabulary), isRaw: true, source: "built-in dictionary"}
}
