package sandboxdapi

// The bounds of a Logs answer, on which a caller paging by time (kubectl
// logs --follow) decides whether an answer may have been cut.
const (
	// MaxLogsAnswerBytes bounds the text of one Logs answer's lines, but
	// for its first line: the e2b API writes each line twice, JSON-escaped
	// (up to 6 bytes a byte), so 1,000 lines of 64 KiB would be most of a
	// GiB of its memory.
	MaxLogsAnswerBytes = 2 << 20
	// MaxLogLineBytes bounds one line's text; the rest of a longer line is
	// dropped.
	MaxLogLineBytes = 64 << 10
)
