package envoysim

// partialCut is how much of a body of size bytes BUFFERED_PARTIAL sends, and
// whether that is all of it (ext_proc.cc handleDataBufferedPartialMode):
// each data chunk is queued, and the queue goes out, consolidated, at the
// end of the stream or as soon as it holds more than the buffer limit
// (queueOverHighLimit: bytesEnqueued() > bufferLimit()), so the message
// may carry up to a chunk more than the limit. Chunks are Options.ChunkSize
// bytes; with none the body arrived in one piece and goes out whole.
func (x *exchange) partialCut(size int) (n int, whole bool) {
	chunk := x.f.opts.ChunkSize
	if chunk <= 0 {
		return size, true
	}
	for n < size {
		n = min(n+chunk, size)
		if n > x.f.opts.BufferLimit {
			break
		}
	}
	return n, n == size
}
