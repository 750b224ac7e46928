// Package failure holds the types that the operator surfaces of the outbox and the inbox
// (outbox.Admin, inbox.Admin) share about failed rows: a [Group] of rows that failed with the
// same error, and one failed [Attempt] of a row's history. It imports only the standard
// library, so every package and tool can use its types.
package failure

import "time"

// Group is the failed rows (archived ones aside) that share an error class and a normalised
// last error: UUIDs, runs of 16 or more hex digits and numbers replaced by <id>, <hex> and
// <n>, so that "order 41 …" and "order 42 …" fall in one group.
type Group struct {
	// Class is the error class: "dead", or "rejected: " and the rejection code (outbox);
	// "poisoned" (past the attempt ceiling or failed permanently) or "retrying" (inbox).
	Class string
	// Message is the normalised last error (at most 500 characters).
	Message string
	// Count is the number of rows in the group.
	Count int64
	// First and Last are the oldest and newest last failure of the group's rows.
	First, Last time.Time
	// Example is one row's last error as it was written.
	Example string
	// Where lists up to 5 destinations (outbox) or sources (inbox) of the group's rows.
	Where []string
	// EventTypes lists up to 5 event types of the group's rows.
	EventTypes []string
}

// Attempt is one failed attempt of a row, as its history keeps it (the last 20).
type Attempt struct {
	// Attempt is the attempt's number (1 for the first).
	Attempt int `json:"attempt"`
	// At is when the attempt failed.
	At time.Time `json:"at"`
	// Error is the attempt's error (at most 1024 bytes).
	Error string `json:"error"`
	// Code is the rejection code of an outbox attempt Kafka refused for good; empty otherwise
	// (always empty in the inbox).
	Code string `json:"code,omitempty"`
}
