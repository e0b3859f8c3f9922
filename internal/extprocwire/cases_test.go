package extprocwire

import (
	"fmt"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// headerMap is a HeaderMap with raw_value set, as Envoy sends headers
// (ext_proc mutation_utils.cc, MutationUtils::headersToProto).
func headerMap(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

// typicalRequestHeaders is a POST's request headers as the envoysim
// driver sends them: 12 headers and the request attributes.
func typicalRequestHeaders() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(":authority", "orders.example.com", ":path", "/v1/orders", ":method", "POST",
				":scheme", "https", "content-type", "application/json", "content-length", "256",
				"idempotency-key", "7f1c2e4a-93b1-4f55-8a7e-2c1b9d0e6f11", "user-agent", "curl/8.5.0",
				"accept", "*/*", "x-forwarded-proto", "https", "x-request-id", "0b3f3f7e-2c5d-4e8f-9a61-0c2d9f1e5b77",
				"x-envoy-expected-rq-timeout-ms", "15000"),
		}},
		Attributes: map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{
			"request.path":   structpb.NewStringValue("/v1/orders"),
			"request.method": structpb.NewStringValue("POST"),
			"source.address": structpb.NewStringValue("10.0.0.7:51234"),
		}}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  procmodev3.ProcessingMode_BUFFERED,
			ResponseBodyMode: procmodev3.ProcessingMode_BUFFERED,
		},
	}
}

func bodyRequest(n int, response bool) *extprocv3.ProcessingRequest {
	b := &extprocv3.HttpBody{Body: make([]byte, n), EndOfStream: true}
	for i := range b.Body {
		b.Body[i] = byte('a' + i%26)
	}
	if response {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: b}}
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: b}}
}

func responseHeadersRequest() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: headerMap(":status", "201", "content-type", "application/json", "content-length", "1024",
			"date", "Tue, 01 Dec 2026 11:00:00 GMT", "x-envoy-upstream-service-time", "3"),
	}}}
}

// requestCases are well-formed messages the fast decoder must take
// without falling back (TestFastPathTakesEnvoysMessages).
func requestCases() map[string]*extprocv3.ProcessingRequest {
	return map[string]*extprocv3.ProcessingRequest{
		"request headers":  typicalRequestHeaders(),
		"request body":     bodyRequest(256, false),
		"response headers": responseHeadersRequest(),
		"response body":    bodyRequest(1024, true),
		"empty body":       {Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{}}},
		"GET headers, end of stream, value field": {Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers:     &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", Value: "GET"}, {Key: "x-ü", Value: "ü", RawValue: []byte{0xff}}}},
			EndOfStream: true,
		}}},
		"request trailers":  {Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{Trailers: headerMap("grpc-status", "0")}}},
		"response trailers": {Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}},
		"metadata and observability": {
			Request:           &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("x"), EndOfStreamWithoutMessage: true, GrpcMessageCompressed: true, DrainComplete: true}},
			MetadataContext:   &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"ns": {Fields: map[string]*structpb.Value{"k": structpb.NewBoolValue(true)}}}},
			ObservabilityMode: true,
		},
		"flow control": {
			Request:            &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("x")}},
			FlowControlInit:    &extprocv3.ProcessingRequest_FlowControlInit{InitialWindowDownstreamToSidestream: 65536, InitialWindowSidestreamToUpstream: 1, InitialWindowUpstreamToSidestream: -1, InitialWindowSidestreamToDownstream: 7},
			ClientWindowUpdate: &extprocv3.ProcessingRequest_ClientWindowUpdate{WindowIncrementSidestreamToUpstream: 10, WindowIncrementSidestreamToDownstream: 20},
		},
		"deprecated header attributes": {Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			//lint:ignore SA1019 the deprecated field, still read by internal/extproc.
			Attributes: map[string]*structpb.Struct{"a": {}, "": {Fields: map[string]*structpb.Value{"n": structpb.NewNumberValue(1.5)}}},
		}}},
		"no oneof": {ObservabilityMode: true},
		// Envoy's own shape when it forwards no namespace (ext_proc.cc
		// Filter::addDynamicMetadata sets an empty Metadata).
		"empty metadata": {
			Request:         &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("x"), EndOfStream: true}},
			MetadataContext: &corev3.Metadata{},
		},
	}
}

// tag and the helpers below build wire bytes by hand for the shapes
// proto.Marshal never writes.
func tag(num protowire.Number, typ protowire.Type) []byte { return protowire.AppendTag(nil, num, typ) }

func lenField(num protowire.Number, parts ...[]byte) []byte {
	var body []byte
	for _, p := range parts {
		body = append(body, p...)
	}
	return protowire.AppendBytes(tag(num, protowire.BytesType), body)
}

func varField(num protowire.Number, v uint64) []byte {
	return protowire.AppendVarint(tag(num, protowire.VarintType), v)
}

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func mustMarshal(m proto.Message) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// structOf is a google.protobuf.Struct of the given map entries.
func structOf(entries ...[]byte) []byte { return cat(entries...) }

// valueEntry is a Struct.fields entry whose Value has the bytes value.
func valueEntry(key string, value []byte) []byte {
	return lenField(1, lenField(1, []byte(key)), lenField(2, value))
}

// trickyRequests are inputs where proto's rules are easy to get wrong:
// the fast decoder must agree with proto.Unmarshal on every one (accept
// iff it accepts, and then the same message).
func trickyRequests() map[string][]byte {
	hv := func(k, raw string) []byte { return lenField(1, lenField(1, []byte(k)), lenField(3, []byte(raw))) }
	rh := func(parts ...[]byte) []byte { return lenField(2, lenField(1, parts...)) }
	entry := func(k string, v proto.Message) []byte {
		return lenField(9, lenField(1, []byte(k)), lenField(2, mustMarshal(v)))
	}
	s1 := &structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewStringValue("1")}}
	s2 := &structpb.Struct{Fields: map[string]*structpb.Value{"b": structpb.NewStringValue("2")}}
	return map[string][]byte{
		"empty":                               nil,
		"oneof member twice merges":           cat(rh(hv("a", "1")), rh(hv("b", "2")), lenField(2, varField(3, 1))),
		"other oneof member replaces":         cat(rh(hv("a", "1")), lenField(4, lenField(1, []byte("body")))),
		"oneof back to the first member":      cat(rh(hv("a", "1")), lenField(4, lenField(1, []byte("body"))), rh(hv("b", "2"))),
		"scalar twice, last wins":             cat(varField(10, 1), varField(10, 0), lenField(4, lenField(1, []byte("x")), lenField(1, []byte("y")))),
		"bool as a large varint":              cat(varField(10, 1<<40), lenField(4, varField(2, 2))),
		"overlong varint":                     cat(tag(10, protowire.VarintType), []byte{0x81, 0x80, 0x80, 0x00}),
		"eleven-byte varint":                  cat(tag(10, protowire.VarintType), []byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}),
		"negative enum":                       lenField(11, varField(1, uint64(1<<64-3))),
		"enum above int32":                    lenField(11, varField(2, 1<<33|5)),
		"unknown top-level field":             cat(rh(hv("a", "1")), varField(99, 7)),
		"unknown field in a header":           rh(lenField(1, lenField(1, []byte("a")), varField(4, 1))),
		"reserved field 1":                    cat(varField(1, 1), rh()),
		"wrong wire type for a message":       varField(2, 1),
		"wrong wire type for a bool":          lenField(10, []byte{1}),
		"wrong wire type for a key":           rh(lenField(1, varField(1, 5))),
		"invalid UTF-8 key":                   rh(hv("\xff", "v")),
		"invalid UTF-8 value":                 rh(lenField(1, lenField(2, []byte("\xc3")))),
		"invalid UTF-8 raw_value is fine":     rh(hv("k", "\xff\xfe")),
		"invalid UTF-8 map key":               lenField(9, lenField(1, []byte("\xff"))),
		"truncated length":                    cat(tag(2, protowire.BytesType), []byte{5, 1}),
		"truncated tag":                       []byte{0x80},
		"field number zero":                   varField(0, 1),
		"field number too large":              protowire.AppendVarint(protowire.AppendVarint(nil, uint64(protowire.MaxValidNumber+1)<<3), 1),
		"group":                               cat(tag(20, protowire.StartGroupType), varField(1, 1), tag(20, protowire.EndGroupType)),
		"unmatched end group":                 tag(20, protowire.EndGroupType),
		"fixed32 field":                       protowire.AppendFixed32(tag(10, protowire.Fixed32Type), 1),
		"map entry without key":               lenField(9, lenField(2, mustMarshal(s1))),
		"map entry without value":             lenField(9, lenField(1, []byte("k"))),
		"empty map entry":                     lenField(9),
		"map entry value twice merges":        lenField(9, lenField(1, []byte("k")), lenField(2, mustMarshal(s1)), lenField(2, mustMarshal(s2))),
		"map key twice, last wins":            lenField(9, lenField(1, []byte("k")), lenField(1, []byte("j")), lenField(2, mustMarshal(s1))),
		"map value before key":                lenField(9, lenField(2, mustMarshal(s1)), lenField(1, []byte("k"))),
		"duplicate map key replaces":          cat(entry("k", s1), entry("k", s2)),
		"unknown field in map entry":          lenField(9, lenField(1, []byte("k")), varField(3, 1)),
		"bad struct in map":                   lenField(9, lenField(1, []byte("k")), lenField(2, []byte{0x0a, 0x05})),
		"metadata twice merges":               cat(lenField(8, mustMarshal(&corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"a": s1}})), lenField(8, mustMarshal(&corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"b": s2}}))),
		"protocol config twice merges":        cat(lenField(11, varField(1, 1)), lenField(11, varField(3, 1))),
		"header map twice appends":            lenField(2, lenField(1, hv("a", "1")), lenField(1, hv("b", "2"))),
		"trailers with a bad header":          lenField(6, lenField(1, lenField(1, lenField(1, []byte("\xff"))))),
		"empty header value message":          rh(lenField(1)),
		"empty headers message":               lenField(3),
		"flow control twice merges":           cat(lenField(12, varField(1, 5)), lenField(12, varField(2, 6)), lenField(13, varField(1, 1)), lenField(13, varField(2, 2))),
		"wrong wire type in flow control":     lenField(12, lenField(1)),
		"struct scalar kinds":                 lenField(9, lenField(1, []byte("k")), lenField(2, structOf(valueEntry("n", varField(1, 0)), valueEntry("d", protowire.AppendFixed64(tag(2, protowire.Fixed64Type), 0x7ff8000000000001)), valueEntry("b", varField(4, 3)), valueEntry("s", lenField(3, []byte("ü")))))),
		"struct null value out of range":      lenField(9, lenField(1, []byte("k")), lenField(2, structOf(valueEntry("n", varField(1, 1<<40|7))))),
		"struct empty value and no value":     lenField(9, lenField(1, []byte("k")), lenField(2, structOf(valueEntry("e", nil), lenField(1, lenField(1, []byte("v")))))),
		"struct duplicate key":                lenField(9, lenField(1, []byte("k")), lenField(2, structOf(valueEntry("a", lenField(3, []byte("1"))), valueEntry("a", varField(4, 1))))),
		"struct value with two kinds":         lenField(9, lenField(1, []byte("k")), lenField(2, structOf(valueEntry("a", cat(lenField(3, []byte("1")), varField(4, 1)))))),
		"struct value field twice":            lenField(9, lenField(1, []byte("k")), lenField(2, structOf(lenField(1, lenField(1, []byte("a")), lenField(2, varField(4, 1)), lenField(2, lenField(3, []byte("x"))))))),
		"struct key twice":                    lenField(9, lenField(1, []byte("k")), lenField(2, structOf(lenField(1, lenField(1, []byte("a")), lenField(1, []byte("b")), lenField(2, varField(4, 1)))))),
		"struct nested":                       lenField(9, lenField(1, []byte("k")), lenField(2, structOf(valueEntry("a", lenField(5, structOf(valueEntry("b", varField(4, 1)))))))),
		"struct list":                         lenField(9, lenField(1, []byte("k")), lenField(2, structOf(valueEntry("a", lenField(6, lenField(1, varField(4, 1))))))),
		"struct number as a varint":           lenField(9, lenField(1, []byte("k")), lenField(2, structOf(valueEntry("a", varField(2, 1))))),
		"struct invalid UTF-8 value":          lenField(9, lenField(1, []byte("k")), lenField(2, structOf(valueEntry("a", lenField(3, []byte("\xff")))))),
		"struct invalid UTF-8 key":            lenField(9, lenField(1, []byte("k")), lenField(2, structOf(valueEntry("\xff", varField(4, 1))))),
		"struct unknown field":                lenField(9, lenField(1, []byte("k")), lenField(2, cat(structOf(valueEntry("a", varField(4, 1))), varField(2, 1)))),
		"struct in two value fields":          lenField(9, lenField(1, []byte("k")), lenField(2, structOf(valueEntry("a", varField(4, 1)))), lenField(2, structOf(valueEntry("b", lenField(5, nil))))),
		"struct flat then nested, same entry": lenField(9, lenField(1, []byte("k")), lenField(2, structOf(valueEntry("a", varField(4, 1)), valueEntry("z", lenField(5, nil))))),
		"deprecated attributes twice":         lenField(2, lenField(2, lenField(1, []byte("a"))), lenField(2, lenField(1, []byte("a")), lenField(2, mustMarshal(s1)))),
	}
}

// responseCases are the responses the server sends (internal/extproc:
// reply.go, render.go, grpcstatus.go, grpc.go, response.go)
// and the rest of what the fast encoder writes.
func responseCases() map[string]*extprocv3.ProcessingResponse {
	skip := &procmodev3.ProcessingMode{RequestBodyMode: procmodev3.ProcessingMode_NONE, ResponseHeaderMode: procmodev3.ProcessingMode_SKIP,
		ResponseBodyMode: procmodev3.ProcessingMode_NONE, RequestTrailerMode: procmodev3.ProcessingMode_SKIP, ResponseTrailerMode: procmodev3.ProcessingMode_SKIP}
	// set is a header option as internal/extproc's setHeader builds it:
	// the deprecated append beside append_action.
	set := func(k, v string, action corev3.HeaderValueOption_HeaderAppendAction) *corev3.HeaderValueOption {
		o := &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}, AppendAction: action}
		//lint:ignore SA1019 the server sets it.
		o.Append = wrapperspb.Bool(action == corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD)
		return o
	}
	cases := map[string]*extprocv3.ProcessingResponse{
		"CONTINUE request headers":                        {Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}},
		"CONTINUE request headers with a common response": {Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}},
		"skip-everything override":                        {Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}, ModeOverride: skip},
		"mode override alone":                             {ModeOverride: skip},
		"CONTINUE response headers":                       {Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}},
		"CONTINUE request body":                           {Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}},
		"request body with mode override": {Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}},
			ModeOverride: &procmodev3.ProcessingMode{ResponseBodyMode: procmodev3.ProcessingMode_BUFFERED}},
		"CONTINUE response body": {Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}},
		"trailers":               {Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}, ModeOverride: skip},
		"response trailers with mutation": {Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{
			HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("grpc-status", "0", 0)}}}}},
		"response headers with added headers": {Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
			HeaderMutation: &extprocv3.HeaderMutation{
				SetHeaders: []*corev3.HeaderValueOption{
					set("idempotency-replayed", "true", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD),
					set("warning", "199 - x", corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD),
					{Header: &corev3.HeaderValue{Key: "k", Value: "v"}, KeepEmptyValue: true},
					{Header: &corev3.HeaderValue{Key: "no-append"}},
				},
				RemoveHeaders: []string{"x-internal", ""},
			},
			ClearRouteCache: true,
		}}}},
		"immediate response": {Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode_Conflict},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				set("content-type", "application/problem+json", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD),
				set("retry-after", "1", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD),
			}},
			Body:    []byte(`{"type":"about:blank","title":"request in progress","status":409}`),
			Details: "idempotency_in_progress",
		}}},
		"grpc immediate response": {Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode_OK}, GrpcStatus: &extprocv3.GrpcStatus{Status: 6}, Details: "already exists: ü",
		}}},
		"grpc status zero":            {Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{GrpcStatus: &extprocv3.GrpcStatus{}, Status: &typev3.HttpStatus{}}}},
		"empty immediate response":    {Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{}}},
		"override message timeout":    {OverrideMessageTimeout: durationpb.New(1500e6)},
		"negative duration":           {OverrideMessageTimeout: &durationpb.Duration{Seconds: -1, Nanos: -5}},
		"server window update":        {ServerWindowUpdate: &extprocv3.ProcessingResponse_ServerWindowUpdate{WindowIncrementDownstreamToSidestream: 65536, WindowIncrementUpstreamToSidestream: -2}},
		"drain flags":                 {RequestDrain: true, RequestDrainRequests: true, RequestDrainResponses: true},
		"empty":                       {},
		"status enum out of range":    {Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{Status: -7}}}},
		"dynamic metadata":            {Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}, DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{"idem": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"decision": structpb.NewStringValue("replay")}})}}},
		"trailers in common response": {Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{Trailers: headerMap("a", "b")}}}},
	}
	many := &extprocv3.HeaderMutation{}
	for i := range 40 { // more nested messages than the encoder's stack of lengths
		many.SetHeaders = append(many.SetHeaders, set(fmt.Sprintf("x-h%d", i), "v", corev3.HeaderValueOption_ADD_IF_ABSENT))
	}
	cases["forty added headers"] = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: many}}}, ModeOverride: skip}
	for name, mut := range map[string]*extprocv3.BodyMutation{
		"body":              {Mutation: &extprocv3.BodyMutation_Body{Body: []byte(`{"id":1}`)}},
		"empty body":        {Mutation: &extprocv3.BodyMutation_Body{}},
		"clear body":        {Mutation: &extprocv3.BodyMutation_ClearBody{ClearBody: true}},
		"clear body false":  {Mutation: &extprocv3.BodyMutation_ClearBody{}},
		"streamed response": {Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: []byte("chunk"), EndOfStream: true, EndOfStreamWithoutMessage: true, GrpcMessageCompressed: true, DrainComplete: true}}},
		"empty streamed":    {Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{}}},
		"no mutation":       {},
	} {
		cases[fmt.Sprintf("body mutation: %s", name)] = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{Status: extprocv3.CommonResponse_CONTINUE_AND_REPLACE, BodyMutation: mut},
		}}}
	}
	return cases
}

// fallbackResponses are responses the fast encoder leaves to proto.Marshal.
func fallbackResponses() map[string]*extprocv3.ProcessingResponse {
	withUnknown := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
	withUnknown.GetRequestHeaders().ProtoReflect().SetUnknown(varField(9, 1))
	return map[string]*extprocv3.ProcessingResponse{
		"unknown field": withUnknown,
		"unknown field in append": func() *extprocv3.ProcessingResponse {
			a := wrapperspb.Bool(true)
			a.ProtoReflect().SetUnknown(varField(7, 1))
			o := &corev3.HeaderValueOption{}
			//lint:ignore SA1019 the field under test.
			o.Append = a
			return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{o}}}}}
		}(),
		"nil oneof member": {Response: &extprocv3.ProcessingResponse_RequestBody{}},
		"nil header option": {Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
			HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{nil}}}}}},
		"invalid UTF-8 details":     {Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{Details: "\xff"}}},
		"invalid UTF-8 remove":      {Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{HeaderMutation: &extprocv3.HeaderMutation{RemoveHeaders: []string{"\xff"}}}}},
		"streamed immediate":        {Response: &extprocv3.ProcessingResponse_StreamedImmediateResponse{StreamedImmediateResponse: &extprocv3.StreamedImmediateResponse{}}},
		"invalid UTF-8 in a Struct": {DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{"\xff": structpb.NewNullValue()}}},
	}
}
