// Package rpc is the generic half of the controller's HTTP+JSON API: bearer tokens and their
// scopes, routes, errors as HTTP statuses and back, the client, how a process finds and dials
// a controller (its Unix socket, or TCP with a pinned certificate) and the guarded listener.
// It knows no service, replica or job: internal/api puts the domain's routes and types on top,
// and proxy/attach its two routes, so a standalone proxy links neither jobs nor replicas nor
// launcher.
package rpc
