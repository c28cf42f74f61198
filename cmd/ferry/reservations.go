package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ferryserve/ferry/internal/infra"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/provision"
)

// showReservations is `ferry show-gpus --reservations`: the reservations and capacity blocks
// every enabled infra holds (launcher.Reserver), with their windows and use.
// which (--infra) keeps one infra's.
func showReservations(ctx context.Context, out io.Writer, which string) error {
	return withInfras(ctx, func(ctx context.Context, set *infra.Set) error {
		list, errs := set.Reservations(ctx)
		if which = strings.ToLower(which); which == "k8s" {
			which = "kubernetes"
		}
		if which != "" {
			list = slices.DeleteFunc(list, func(r launcher.ReservationOffer) bool { return !provision.InfraMatches(which, r.Infra) })
		}
		return writeReservations(out, list, errs, time.Now())
	})
}

// writeReservations prints one row per reservation, then the infras that could not answer.
func writeReservations(out io.Writer, list []launcher.ReservationOffer, errs map[string]error, now time.Time) error {
	fmt.Fprintln(out, "Reservations and capacity blocks")
	if len(list) == 0 {
		fmt.Fprintln(out, "  none (reservations come from GCP reservations and future reservations, AWS capacity blocks and ODCRs)")
	} else {
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "INFRA\tID\tKIND\tINSTANCE\tGPUS\tZONE\tWINDOW (UTC)\tSTATE\tIN USE")
		for _, r := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\n", r.Infra, reservationName(r), r.Kind, dash(r.InstanceType),
				dash(r.Accelerator), dash(cmp.Or(r.Zone, r.Region)), reservationWindow(r), reservationState(r, now), r.InUse, r.Count)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, n := range slices.Sorted(maps.Keys(errs)) {
		fmt.Fprintf(out, "  %s: %v\n", n, errs[n])
	}
	return nil
}

func reservationName(r launcher.ReservationOffer) string {
	if r.Name != "" && r.Name != r.ID {
		return r.ID + " (" + r.Name + ")"
	}
	return r.ID
}

func reservationWindow(r launcher.ReservationOffer) string {
	const layout = "2006-01-02 15:04"
	start, end := "-", "open"
	if !r.Start.IsZero() {
		start = r.Start.UTC().Format(layout)
	}
	if !r.End.IsZero() {
		end = r.End.UTC().Format(layout)
	}
	return start + " – " + end
}

// reservationState says where now falls in the window: "starts in 2h", "active, 3h left".
func reservationState(r launcher.ReservationOffer, now time.Time) string {
	switch {
	case now.Before(r.Start):
		return "starts in " + roundDuration(r.Start.Sub(now))
	case !r.End.IsZero() && !now.Before(r.End):
		return "ended"
	case r.End.IsZero():
		return "active"
	}
	return "active, " + roundDuration(r.End.Sub(now)) + " left"
}

func roundDuration(d time.Duration) string {
	switch {
	case d >= 48*time.Hour:
		return strconv.Itoa(int(d/(24*time.Hour))) + "d"
	case d >= time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h" + strconv.Itoa(int(d%time.Hour/time.Minute)) + "m"
	case d >= time.Minute:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	}
	return strconv.Itoa(int(d/time.Second)) + "s"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
