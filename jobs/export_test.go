package jobs

// MayRunOn exports mayRunOn to the package's external tests.
var MayRunOn = mayRunOn
