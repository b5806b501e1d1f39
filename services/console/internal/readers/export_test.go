package readers

// OnChecked sets a hook that v's Replay calls with the group between its
// checks and its request.
func OnChecked(v *View, f func(group string)) { v.checked = f }
